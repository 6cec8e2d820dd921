//! Bounding a kernel's loops before it reaches the driver.
//!
//! GPU work cannot be preempted, and on a software adapter a looping shader
//! holds a CPU thread for as long as it loops; naga's own loop bounding only
//! guards against undefined behaviour (2⁶⁴ iterations). So the host rewrites
//! the validated module: one per-invocation counter (a `private` global) is
//! shared by every loop of every function, and each loop body starts with
//! `if counter >= budget { break; } counter += 1;`, where `budget` is a
//! uniform the host binds at `@group(0) @binding(BUDGET_BINDING)` for each
//! dispatch (a binding plugins may not use). An invocation therefore runs at
//! most `budget` loop iterations in all, and (WGSL has no recursion) a
//! dispatch's work is bounded by invocations × budget × the kernel's size:
//! the host sets the budget per dispatch so that the product stays under its
//! cap (see `dispatch`). A kernel that reaches the budget has its loops cut
//! short: its results are then wrong, but the host is safe.

use naga::{Arena, BinaryOperator, Block, Expression, Handle, Literal, Module, Span, Statement};

/// The binding of the host's loop-budget uniform (a `u32`) in `@group(0)`:
/// wgpu's default `max_bindings_per_bind_group` is 1000, so plugins' own
/// bindings stay below it.
pub const BUDGET_BINDING: u32 = 999;

/// Deepest statement nesting the rewrite follows (naga's parser already
/// refuses deeper sources; this keeps the walk bounded on its own).
const MAX_DEPTH: usize = 256;

/// Rewrites every loop of `module` to stop after the host-bound budget of
/// iterations per invocation (all loops together); returns the number of
/// loops bounded (with none, the module is unchanged).
pub fn bound_loops(module: &mut Module) -> Result<usize, String> {
    if count_loops(module) == 0 {
        return Ok(0);
    }
    let u32_ty = module.types.insert(naga::Type { name: None, inner: naga::TypeInner::Scalar(naga::Scalar::U32) }, Span::UNDEFINED);
    let global = |name: &str, space, binding| naga::GlobalVariable {
        name: Some(name.into()),
        space,
        binding,
        ty: u32_ty,
        init: None,
        memory_decorations: Default::default(),
    };
    let counter = module.global_variables.append(global("kiln_loop_iterations", naga::AddressSpace::Private, None), Span::UNDEFINED);
    let binding = Some(naga::ResourceBinding { group: 0, binding: BUDGET_BINDING });
    let budget = module.global_variables.append(global("kiln_loop_budget", naga::AddressSpace::Uniform, binding), Span::UNDEFINED);
    let mut loops = 0;
    let functions = module.functions.iter_mut().map(|(_, f)| f).chain(module.entry_points.iter_mut().map(|e| &mut e.function));
    for function in functions {
        loops += bound_block(&mut function.body, &mut function.expressions, (counter, budget), 0)?;
    }
    Ok(loops)
}

/// The loops of `module` (a walk as deep as [`MAX_DEPTH`]).
fn count_loops(module: &Module) -> usize {
    fn count(block: &Block, depth: usize) -> usize {
        if depth > MAX_DEPTH {
            return 1;
        }
        block
            .iter()
            .map(|statement| match statement {
                Statement::Block(inner) => count(inner, depth + 1),
                Statement::If { accept, reject, .. } => count(accept, depth + 1) + count(reject, depth + 1),
                Statement::Switch { cases, .. } => cases.iter().map(|c| count(&c.body, depth + 1)).sum(),
                Statement::Loop { .. } => 1,
                _ => 0,
            })
            .sum()
    }
    module.functions.iter().map(|(_, f)| &f.body).chain(module.entry_points.iter().map(|e| &e.function.body)).map(|b| count(b, 0)).sum()
}

type Globals = (Handle<naga::GlobalVariable>, Handle<naga::GlobalVariable>);

fn bound_block(block: &mut Block, exprs: &mut Arena<Expression>, globals: Globals, depth: usize) -> Result<usize, String> {
    if depth > MAX_DEPTH {
        return Err(format!("statements nest deeper than {MAX_DEPTH}"));
    }
    let mut loops = 0;
    for (statement, _) in block.span_iter_mut() {
        match statement {
            Statement::Block(inner) => loops += bound_block(inner, exprs, globals, depth + 1)?,
            Statement::If { accept, reject, .. } => {
                loops += bound_block(accept, exprs, globals, depth + 1)?;
                loops += bound_block(reject, exprs, globals, depth + 1)?;
            }
            Statement::Switch { cases, .. } => {
                for case in cases {
                    loops += bound_block(&mut case.body, exprs, globals, depth + 1)?;
                }
            }
            Statement::Loop { body, continuing, .. } => {
                loops += bound_block(body, exprs, globals, depth + 1)?;
                loops += bound_block(continuing, exprs, globals, depth + 1)?;
                let rest = std::mem::take(body);
                *body = guard(exprs, globals);
                body.extend_block(rest);
                loops += 1;
            }
            _ => {}
        }
    }
    Ok(loops)
}

/// `if counter >= budget { break; } counter = counter + 1;`
fn guard(exprs: &mut Arena<Expression>, (counter, budget): Globals) -> Block {
    let at = Span::UNDEFINED;
    // Pointers and literals are not emitted; the rest is, in order.
    let pointer = exprs.append(Expression::GlobalVariable(counter), at);
    let budget = exprs.append(Expression::GlobalVariable(budget), at);
    let one = exprs.append(Expression::Literal(Literal::U32(1)), at);
    let count = exprs.append(Expression::Load { pointer }, at);
    let limit = exprs.append(Expression::Load { pointer: budget }, at);
    let spent = exprs.append(Expression::Binary { op: BinaryOperator::GreaterEqual, left: count, right: limit }, at);
    let next = exprs.append(Expression::Binary { op: BinaryOperator::Add, left: count, right: one }, at);
    let mut block = Block::new();
    block.push(Statement::Emit(naga::Range::new_from_bounds(count, spent)), at);
    block.push(Statement::If { condition: spent, accept: Block::from_vec(vec![Statement::Break]), reject: Block::new() }, at);
    block.push(Statement::Emit(naga::Range::new_from_bounds(next, next)), at);
    block.push(Statement::Store { pointer, value: next }, at);
    block
}

#[cfg(test)]
mod tests {
    use super::*;

    fn validate(module: &Module) -> Result<naga::valid::ModuleInfo, String> {
        let flags = naga::valid::ValidationFlags::all() - naga::valid::ValidationFlags::CONTROL_FLOW_UNIFORMITY;
        naga::valid::Validator::new(flags, naga::valid::Capabilities::empty()).validate(module).map_err(|e| format!("{e:?}"))
    }

    #[test]
    fn every_loop_is_bounded_and_the_module_stays_valid() {
        let src = r#"
            @group(0) @binding(0) var<storage, read_write> out: array<f32>;
            fn spin(n: u32) -> u32 { var i = 0u; loop { if i > n { break; } i += 1u; } return i; }
            @compute @workgroup_size(1) fn main() {
                var s = 0u;
                for (var i = 0u; i < 10u; i++) { while (true) { s += spin(i); if s > 5u { break; } } }
                out[0] = f32(s);
            }"#;
        let mut module = naga::front::wgsl::parse_str(src).unwrap();
        validate(&module).unwrap();
        assert_eq!(bound_loops(&mut module).unwrap(), 3);
        validate(&module).unwrap();
        assert!(module.global_variables.iter().any(|(_, g)| g.name.as_deref() == Some("kiln_loop_iterations")));
        let budget = module.global_variables.iter().find(|(_, g)| g.name.as_deref() == Some("kiln_loop_budget")).unwrap().1;
        assert_eq!(budget.binding, Some(naga::ResourceBinding { group: 0, binding: BUDGET_BINDING }));
        // Without loops the module is left alone.
        let mut plain = naga::front::wgsl::parse_str("@compute @workgroup_size(1) fn main() {}").unwrap();
        assert_eq!(bound_loops(&mut plain).unwrap(), 0);
        assert!(plain.global_variables.is_empty());
    }
}
