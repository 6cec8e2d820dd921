//! `#[node]`: a typed Rust function becomes a kiln node class.
//!
//! The function's parameters are the node's inputs (their Rust types pick the
//! socket or widget, `#[input(..)]` sets widget options, `#[hidden]` asks the
//! host for a hidden value) and its return type its outputs (a tuple for
//! several). The attribute leaves the function as written, callable and
//! testable with plain values, and adds beside it a `NodeClass` constant
//! (the function's name in upper case) holding the generated definition and
//! dispatch, to list in `kiln_sdk::export_plugin!`.
//!
//! Everything is checked when the plugin compiles: an input is a parameter,
//! so a misspelled one is an unknown variable; a widget option that does not
//! fit the parameter's type, a default of the wrong type or a number of
//! output names that differs from the number of outputs is a compile error.
//! This crate parses (`parse`) and writes the code (`expand`); the traits the
//! generated code calls live in `kiln_sdk::typed`.

use proc_macro::TokenStream;

mod expand;
mod parse;

/// Makes a node class of a function. See the `kiln_sdk` crate documentation.
#[proc_macro_attribute]
pub fn node(attr: TokenStream, item: TokenStream) -> TokenStream {
    let mut function = syn::parse_macro_input!(item as syn::ItemFn);
    let mut options = parse::NodeOptions::default();
    let read = syn::parse::Parser::parse(syn::meta::parser(|meta| options.parse(meta)), attr);
    // The parameters' attributes come off the function in any case, and the
    // function is kept, so each mistake is reported once.
    let node = parse::Node::new(options, &mut function);
    match (read, node) {
        (Ok(()), Ok(node)) if node.options.category.is_some() => expand::expand(&node, &function).into(),
        (Ok(()), Ok(_)) => {
            let error = syn::Error::new(proc_macro2::Span::call_site(), "a node needs a category: #[node(category = \"image/filters\")]").to_compile_error();
            quote::quote!(#error #function).into()
        }
        (read, node) => {
            let errors = [read.err(), node.err()].into_iter().flatten().map(|e| e.to_compile_error());
            quote::quote!(#(#errors)* #function).into()
        }
    }
}
