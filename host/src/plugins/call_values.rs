//! The edges of a node call: values converted to and from the WIT
//! interface (tensors handed over as resources), outputs checked against
//! the node's definition, and how a trap is classified into a failure.

use wasmtime::Trap;
use wasmtime::component::Resource;

use super::bindings::node::{self, NodeDef};
use super::log_pipe::CapturedLog;
use super::manifest::EffectiveLimits;
use super::outcome::{FailureKind, NodeFailure};
use super::state::{NodeState, Stopped};
use crate::tensor::Tensor;
use crate::value::Value;

pub(super) enum Outcome<R> {
    Done(R),
    Cancelled,
    TimedOut,
    Trapped(wasmtime::Error),
}

pub(super) fn failure(kind: FailureKind, message: String, log: CapturedLog) -> NodeFailure {
    NodeFailure { kind, message, log }
}

/// Turns a trap into a failure kind, using what the store recorded.
pub(super) fn classify_trap(e: &wasmtime::Error, state: &NodeState, limits: EffectiveLimits, log: CapturedLog) -> NodeFailure {
    match state.stop.stopped {
        Some(Stopped::Cancelled) => return failure(FailureKind::Interrupted, "interrupted".into(), log),
        Some(Stopped::Deadline) => return failure(FailureKind::Timeout, format!("node exceeded its time limit of {:?}", limits.timeout), log),
        None => {}
    }
    match &state.memory.denied {
        Some(Some(job)) => return failure(FailureKind::JobOutOfMemory, job.clone(), log),
        Some(None) => return failure(FailureKind::OutOfMemory, format!("node exceeded its memory limit of {} MiB", limits.memory_bytes >> 20), log),
        None => {}
    }
    if let Some(job) = &state.job_out_of_memory {
        return failure(FailureKind::JobOutOfMemory, job.clone(), log);
    }
    if let Some(budget) = &state.over_budget {
        return failure(FailureKind::InvalidOutput, budget.clone(), log);
    }
    let message = match e.downcast_ref::<Trap>() {
        Some(Trap::StackOverflow) => "stack overflow".to_string(),
        // Rust and C guests keep their stack in linear memory; overflowing it
        // runs below address 0 and faults as an out-of-bounds access.
        Some(Trap::MemoryOutOfBounds) => "out-of-bounds memory access (e.g. the plugin's stack overflowed)".to_string(),
        Some(Trap::UnreachableCodeReached) => match log.text.lines().rev().find(|l| l.contains("panicked")) {
            Some(line) => format!("plugin panicked: {}", line.trim()),
            None => "plugin aborted (unreachable code reached)".to_string(),
        },
        Some(trap) => format!("plugin trapped: {trap}"),
        None => format!("plugin failed: {e:#}"),
    };
    failure(FailureKind::Crashed, message, log)
}

pub(super) fn to_wit(value: Value, state: &mut NodeState) -> wasmtime::Result<node::Value> {
    Ok(match value {
        Value::Int(v) => node::Value::Int(v),
        Value::Float(v) => node::Value::Float(v),
        Value::Bool(v) => node::Value::Boolean(v),
        Value::String(v) => node::Value::String(v),
        Value::Tensor(t) => node::Value::Tensor(state.table.push(t)?),
    })
}

pub(super) fn from_wit(values: Vec<node::Value>, state: &mut NodeState) -> Result<Vec<Value>, String> {
    values
        .into_iter()
        .map(|v| {
            Ok(match v {
                node::Value::Int(v) => Value::Int(v),
                node::Value::Float(v) => Value::Float(v),
                node::Value::Boolean(v) => Value::Bool(v),
                node::Value::String(v) => Value::String(v),
                node::Value::Tensor(r) => Value::Tensor(take_tensor(r, state)?),
            })
        })
        .collect()
}

pub(super) fn take_tensor(r: Resource<Tensor>, state: &mut NodeState) -> Result<Tensor, String> {
    state.table.delete(r).map_err(|e| format!("returned an invalid tensor handle: {e}"))
}

/// Checks returned values against the node's declared outputs.
pub(super) fn check_outputs(def: &NodeDef, values: &[Value]) -> Result<(), String> {
    if values.len() != def.outputs.len() {
        return Err(format!("returned {} values for {} declared outputs", values.len(), def.outputs.len()));
    }
    for (i, (out, value)) in def.outputs.iter().zip(values).enumerate() {
        let ok = match (out.type_name.as_str(), value) {
            ("INT", Value::Int(_)) | ("FLOAT", Value::Float(_)) | ("BOOLEAN", Value::Bool(_)) | ("STRING", Value::String(_)) => true,
            ("IMAGE", Value::Tensor(t)) => t.shape().len() == 4 && (1..=4).contains(&t.shape()[3]),
            ("MASK", Value::Tensor(t)) => t.shape().len() == 3,
            ("INT" | "FLOAT" | "BOOLEAN" | "STRING" | "IMAGE" | "MASK", _) => false,
            _ => true,
        };
        if !ok {
            let got = match value {
                Value::Tensor(t) => format!("a tensor of shape {:?}", t.shape()),
                other => other.kind_name().to_string(),
            };
            return Err(format!("output {i} (`{}`) must be {} but is {got}", out.name, out.type_name));
        }
    }
    Ok(())
}
