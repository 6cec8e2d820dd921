//! Bounding a kernel's loops before it reaches the driver.
//!
//! GPU work cannot be preempted, and on a software adapter a looping shader
//! holds a CPU thread for as long as it loops; naga's own loop bounding only
//! guards against undefined behaviour (2⁶⁴ iterations). So the host rewrites
//! the validated module: one per-invocation counter (a `private` global) is
//! shared by every loop of every function, and each loop body starts with
//! `if counter >= budget { break; } counter += 1;`. An invocation therefore
//! runs at most `budget` loop iterations in all, and (WGSL has no recursion)
//! a dispatch's work is bounded by invocations × budget × the kernel's size.
//! A kernel that reaches the budget has its loops cut short: its results are
//! then wrong, but the host is safe.

use naga::{Arena, BinaryOperator, Block, Expression, Handle, Literal, Module, Span, Statement};

/// Deepest statement nesting the rewrite follows (naga's parser already
/// refuses deeper sources; this keeps the walk bounded on its own).
const MAX_DEPTH: usize = 256;

/// Rewrites every loop of `module` to stop after `budget` iterations per
/// invocation (all loops together); returns the number of loops bounded.
pub fn bound_loops(module: &mut Module, budget: u32) -> Result<usize, String> {
    let u32_ty = module.types.insert(naga::Type { name: None, inner: naga::TypeInner::Scalar(naga::Scalar::U32) }, Span::UNDEFINED);
    let counter = module.global_variables.append(
        naga::GlobalVariable {
            name: Some("kiln_loop_iterations".into()),
            space: naga::AddressSpace::Private,
            binding: None,
            ty: u32_ty,
            init: None,
            memory_decorations: Default::default(),
        },
        Span::UNDEFINED,
    );
    let mut loops = 0;
    let functions = module.functions.iter_mut().map(|(_, f)| f).chain(module.entry_points.iter_mut().map(|e| &mut e.function));
    for function in functions {
        loops += bound_block(&mut function.body, &mut function.expressions, counter, budget, 0)?;
    }
    Ok(loops)
}

fn bound_block(block: &mut Block, exprs: &mut Arena<Expression>, counter: Handle<naga::GlobalVariable>, budget: u32, depth: usize) -> Result<usize, String> {
    if depth > MAX_DEPTH {
        return Err(format!("statements nest deeper than {MAX_DEPTH}"));
    }
    let mut loops = 0;
    for (statement, _) in block.span_iter_mut() {
        match statement {
            Statement::Block(inner) => loops += bound_block(inner, exprs, counter, budget, depth + 1)?,
            Statement::If { accept, reject, .. } => {
                loops += bound_block(accept, exprs, counter, budget, depth + 1)?;
                loops += bound_block(reject, exprs, counter, budget, depth + 1)?;
            }
            Statement::Switch { cases, .. } => {
                for case in cases {
                    loops += bound_block(&mut case.body, exprs, counter, budget, depth + 1)?;
                }
            }
            Statement::Loop { body, continuing, .. } => {
                loops += bound_block(body, exprs, counter, budget, depth + 1)?;
                loops += bound_block(continuing, exprs, counter, budget, depth + 1)?;
                let rest = std::mem::take(body);
                *body = guard(exprs, counter, budget);
                body.extend_block(rest);
                loops += 1;
            }
            _ => {}
        }
    }
    Ok(loops)
}

/// `if counter >= budget { break; } counter = counter + 1;`
fn guard(exprs: &mut Arena<Expression>, counter: Handle<naga::GlobalVariable>, budget: u32) -> Block {
    let at = Span::UNDEFINED;
    // Pointers and literals are not emitted; the rest is, in order.
    let pointer = exprs.append(Expression::GlobalVariable(counter), at);
    let limit = exprs.append(Expression::Literal(Literal::U32(budget)), at);
    let one = exprs.append(Expression::Literal(Literal::U32(1)), at);
    let count = exprs.append(Expression::Load { pointer }, at);
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
        assert_eq!(bound_loops(&mut module, 100).unwrap(), 3);
        validate(&module).unwrap();
        assert!(module.global_variables.iter().any(|(_, g)| g.name.as_deref() == Some("kiln_loop_iterations")));
    }
}
