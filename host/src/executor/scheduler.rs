//! Which planned node runs next, and when a result may be dropped.
//!
//! The scheduler keeps, for the nodes that must run, how many upstream
//! results each still waits for and how many readers each result still has.
//! Ready nodes are taken in plan order: the plan lists nodes depth first from
//! the outputs, each after its inputs, so the lowest ready index is the one
//! that finishes the branch in progress (two leaves, then their join) rather
//! than the next independent leaf, and a result is freed as soon as its last
//! reader has run. A parallel node starts only while the job's memory is
//! under half its limit: a wide graph on large images runs its branches one
//! after another instead of holding every branch's results at once.

use std::collections::{BTreeSet, HashMap};

use crate::workflow::{Plan, PlannedInput};

/// The distinct nodes whose outputs `id` reads.
pub fn upstreams<'p>(plan: &'p Plan, id: &str) -> Vec<&'p str> {
    let mut ups: Vec<&str> = plan
        .node(id)
        .map(|n| {
            n.inputs
                .iter()
                .filter_map(|(_, i)| match i {
                    PlannedInput::Link { node, .. } => Some(node.as_str()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    ups.sort_unstable();
    ups.dedup();
    ups
}

/// Dependency bookkeeping of one run.
pub struct Scheduler<'p> {
    plan: &'p Plan,
    /// Plan index of each node that must run.
    index: HashMap<&'p str, usize>,
    /// Upstream results each node still waits for.
    waiting: HashMap<&'p str, usize>,
    /// Nodes to tell when a node's result is there.
    dependents: HashMap<&'p str, Vec<&'p str>>,
    /// Nodes that have yet to start and read each result.
    readers: HashMap<&'p str, usize>,
    /// Runnable nodes by plan index.
    ready: BTreeSet<usize>,
}

impl<'p> Scheduler<'p> {
    /// Bookkeeping for running every planned node for which `available`
    /// (a cached result) is false.
    pub fn new(plan: &'p Plan, available: impl Fn(&str) -> bool) -> Scheduler<'p> {
        let mut s =
            Scheduler { plan, index: HashMap::new(), waiting: HashMap::new(), dependents: HashMap::new(), readers: HashMap::new(), ready: BTreeSet::new() };
        for (i, node) in plan.nodes.iter().enumerate() {
            if available(&node.id) {
                continue;
            }
            let id = node.id.as_str();
            s.index.insert(id, i);
            let ups = upstreams(plan, id);
            for &up in &ups {
                *s.readers.entry(up).or_default() += 1;
            }
            let pending: Vec<&str> = ups.into_iter().filter(|up| !available(up)).collect();
            if pending.is_empty() {
                s.ready.insert(i);
            }
            s.waiting.insert(id, pending.len());
            for up in pending {
                s.dependents.entry(up).or_default().push(id);
            }
        }
        s
    }

    /// Number of nodes that must run.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether nothing must run.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Whether a node is ready to start.
    pub fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }

    /// Takes the ready node that comes first in the plan.
    pub fn take_ready(&mut self) -> Option<&'p str> {
        let i = self.ready.pop_first()?;
        Some(self.plan.nodes[i].id.as_str())
    }

    /// Records that `id` ran (and is done with its inputs): returns the
    /// results no node will read any more.
    pub fn read_done(&mut self, id: &str) -> Vec<&'p str> {
        let mut unread = Vec::new();
        for up in upstreams(self.plan, id) {
            if let Some(n) = self.readers.get_mut(up) {
                *n -= 1;
                if *n == 0 {
                    unread.push(up);
                }
            }
        }
        unread
    }

    /// Makes a node that started ready again (it is to run once more).
    pub fn requeue(&mut self, id: &str) {
        if let Some(&i) = self.index.get(id) {
            self.ready.insert(i);
        }
    }

    /// Whether no node that has yet to run reads `id`'s result.
    pub fn is_unread(&self, id: &str) -> bool {
        self.readers.get(id).is_none_or(|&n| n == 0)
    }

    /// Records that `id`'s result is there; its dependents may become ready.
    pub fn finished(&mut self, id: &str) {
        let Some(dependents) = self.dependents.get(id) else { return };
        for dep in dependents {
            if let Some(w) = self.waiting.get_mut(dep) {
                *w -= 1;
                if *w == 0
                    && let Some(&i) = self.index.get(dep)
                {
                    self.ready.insert(i);
                }
            }
        }
    }
}

/// Whether another node may start beside `running` ones, given the job's
/// memory in use and its limit: a lone node always may (it alone decides
/// whether the job fits), a parallel one only under half the limit.
pub fn may_start(running: usize, concurrency: usize, memory_in_use: u64, memory_limit: u64) -> bool {
    running == 0 || (running < concurrency && memory_in_use < memory_limit / 2)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workflow::PlannedNode;

    fn node(id: &str, ups: &[&str]) -> PlannedNode {
        let inputs = ups.iter().enumerate().map(|(i, up)| (format!("in{i}"), PlannedInput::Link { node: up.to_string(), output: 0 })).collect();
        PlannedNode { id: id.into(), class_type: "C".into(), inputs }
    }

    /// A source, four leaves reading it, joined pairwise: the plan lists
    /// them depth first, as validation does.
    fn tree() -> Plan {
        Plan::new(
            vec![
                node("src", &[]),
                node("a", &["src"]),
                node("b", &["src"]),
                node("ab", &["a", "b"]),
                node("c", &["src"]),
                node("d", &["src"]),
                node("cd", &["c", "d"]),
                node("all", &["ab", "cd"]),
            ],
            vec!["all".into()],
        )
    }

    #[test]
    fn branches_finish_before_new_leaves_start_and_results_free_at_their_last_reader() {
        let plan = tree();
        let mut s = Scheduler::new(&plan, |_| false);
        assert_eq!(s.len(), 8);
        let mut order = Vec::new();
        let mut freed = Vec::new();
        while let Some(id) = s.take_ready() {
            order.push(id);
            freed.push((id, s.read_done(id)));
            s.finished(id);
        }
        assert_eq!(order, ["src", "a", "b", "ab", "c", "d", "cd", "all"]);
        let freed_at: HashMap<&str, Vec<&str>> = freed.into_iter().collect();
        assert_eq!(freed_at["ab"], ["a", "b"]);
        assert_eq!(freed_at["d"], ["src"], "the source is freed by its last reader");
        assert_eq!(freed_at["all"], ["ab", "cd"]);
    }

    #[test]
    fn cached_results_are_not_run_or_waited_for() {
        let plan = tree();
        let mut s = Scheduler::new(&plan, |id| id == "src" || id == "ab");
        assert_eq!(s.len(), 6);
        let mut order = Vec::new();
        while let Some(id) = s.take_ready() {
            order.push(id);
            s.read_done(id);
            s.finished(id);
        }
        assert_eq!(order, ["a", "b", "c", "d", "cd", "all"]);
    }

    #[test]
    fn parallel_starts_stop_at_half_the_memory_limit() {
        assert!(may_start(0, 4, u64::MAX, 100), "a lone node always starts");
        assert!(may_start(1, 4, 49, 100));
        assert!(!may_start(1, 4, 50, 100));
        assert!(!may_start(4, 4, 0, 100), "concurrency caps too");
    }
}
