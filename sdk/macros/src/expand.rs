//! Writing a `#[node]` function's `NodeClass` constant: the definition
//! (inputs from the parameters, outputs from the return type) and the
//! dispatch (each input taken by its type, the outputs converted).
//!
//! Every type-dependent step is a call through a trait of
//! `kiln_sdk::typed`, spanned at the parameter or option that asks for it,
//! so a misfit is a compile error pointing there.

use proc_macro2::TokenStream;
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Ident, ItemFn, LitStr};

use crate::parse::{InputOption, Node, Param};

/// The function, unchanged, and its `NodeClass` constant.
pub fn expand(node: &Node, function: &ItemFn) -> TokenStream {
    let fn_name = &function.sig.ident;
    let vis = &function.vis;
    let bare = fn_name.to_string();
    let bare = bare.strip_prefix("r#").unwrap_or(&bare).to_string();
    let constant = Ident::new(&bare.to_uppercase(), fn_name.span());
    let class = node.options.class.clone().unwrap_or_else(|| LitStr::new(&upper_camel(&bare), fn_name.span()));
    let define = define(node);
    let run = run(node, fn_name);
    let doc = format!("The node class `{}`, made by `#[node]` from [`{bare}`].", class.value());
    quote! {
        // A node's inputs are its parameters: as many as it has inputs.
        #[allow(clippy::too_many_arguments)]
        #function

        #[doc = #doc]
        #vis const #constant: ::kiln_sdk::NodeClass = {
            fn __kiln_define() -> ::kiln_sdk::NodeDef { #define }
            fn __kiln_run(__kiln_inputs: &mut ::kiln_sdk::Inputs) -> ::kiln_sdk::Result<::kiln_sdk::Outputs> { #run }
            ::kiln_sdk::NodeClass { class_type: #class, define: __kiln_define, run: __kiln_run }
        };
    }
}

/// The body of the definition function.
fn define(node: &Node) -> TokenStream {
    let o = &node.options;
    let mut steps = Vec::new();
    if let Some(name) = &o.display_name {
        steps.push(quote!(.display_name(#name)));
    }
    if let Some(text) = &o.description {
        steps.push(quote!(.description(#text)));
    }
    for param in &node.params {
        let name = &param.name;
        let ty = &param.ty;
        steps.push(match &param.hidden {
            Some(variant) => quote!(.hidden(::kiln_sdk::Hidden::#variant)),
            None => {
                let kind = kind(param);
                quote_spanned!(ty.span()=> .input(#name, <#ty as ::kiln_sdk::typed::NodeInput>::OPTIONAL, #kind))
            }
        });
    }
    for (i, ty) in node.outputs.iter().enumerate() {
        let type_name = quote_spanned!(ty.span()=> <#ty as ::kiln_sdk::typed::NodeOutput>::TYPE);
        let name = match &o.outputs {
            Some((names, _)) => {
                let n = &names[i];
                quote!(#n)
            }
            None => type_name.clone(),
        };
        steps.push(quote!(.output(#name, #type_name)));
    }
    for flag in &o.flags {
        steps.push(quote!(.#flag()));
    }
    if !o.search_aliases.is_empty() {
        let aliases = &o.search_aliases;
        steps.push(quote!(.search_aliases(&[#(#aliases),*])));
    }
    for (input, options) in &o.dynamic_combos {
        steps.push(quote!(.dynamic_combo(#input, #options)));
    }
    let category = &o.category;
    quote!(::kiln_sdk::NodeDef::new(#category) #(#steps)*)
}

/// The widget or socket of one input, with its options applied.
fn kind(param: &Param) -> TokenStream {
    let ty = &param.ty;
    let mut base = quote_spanned!(ty.span()=> <#ty as ::kiln_sdk::typed::NodeInput>::kind());
    let mut steps = Vec::new();
    for option in &param.options {
        let (key, value) = match option {
            InputOption::Valued(key, value) => (key, Some(value)),
            InputOption::Flag(key) => (key, None),
        };
        let span = key.span();
        let t = quote_spanned!(span=> ::kiln_sdk::typed);
        match (key.to_string().as_str(), value) {
            // These two replace the widget the type would have.
            ("choices", Some(v)) => base = quote_spanned!(span=> <#ty as #t::ComboInput>::combo(::core::convert::AsRef::<[&str]>::as_ref(&#v))),
            ("image_upload", None) => base = quote_spanned!(span=> <#ty as #t::ComboInput>::image_upload()),
            ("default", Some(v)) => steps.push(quote_spanned!(span=> let k = <#ty as #t::Widget>::with_default(k, #v);)),
            ("min", Some(v)) => steps.push(quote_spanned!(span=> let k = <#ty as #t::NumberInput>::with_min(k, #v);)),
            ("max", Some(v)) => steps.push(quote_spanned!(span=> let k = <#ty as #t::NumberInput>::with_max(k, #v);)),
            ("step", Some(v)) => steps.push(quote_spanned!(span=> let k = <#ty as #t::NumberInput>::with_step(k, #v);)),
            ("display", Some(v)) => steps.push(quote_spanned!(span=> let k = <#ty as #t::NumberInput>::with_display(k, #v);)),
            ("round", Some(v)) => steps.push(quote_spanned!(span=> let k = <#ty as #t::FloatInput>::with_round(k, #v);)),
            ("multiline", None) => steps.push(quote_spanned!(span=> let k = <#ty as #t::TextInput>::with_multiline(k, true);)),
            ("single_line", None) => steps.push(quote_spanned!(span=> let k = <#ty as #t::TextInput>::with_multiline(k, false);)),
            ("control_after_generate", None) => steps.push(quote_spanned!(span=> let k = <#ty as #t::IntInput>::with_control_after_generate(k);)),
            ("tooltip", Some(v)) => steps.push(quote_spanned!(span=> let k = k.tooltip(#v);)),
            // `parse` accepts only the pairs above.
            _ => {}
        }
    }
    quote!({
        let k = #base;
        #(#steps)*
        k
    })
}

/// The body of the dispatch function.
fn run(node: &Node, fn_name: &Ident) -> TokenStream {
    let takes = node.params.iter().map(|p| {
        let (ident, ty, name) = (&p.ident, &p.ty, &p.name);
        let take = match p.hidden {
            Some(_) => quote_spanned!(ty.span()=> <#ty as ::kiln_sdk::typed::HiddenInput>::take(__kiln_inputs, #name)),
            None => quote_spanned!(ty.span()=> <#ty as ::kiln_sdk::typed::NodeInput>::take(__kiln_inputs, #name)),
        };
        quote!(let #ident = #take?;)
    });
    let args = node.params.iter().map(|p| {
        let ident = &p.ident;
        if p.by_ref { quote!(&#ident) } else { quote!(#ident) }
    });
    let call = quote!(__kiln_node(#(#args),*));
    let call = if node.fallible { quote!(#call.map_err(::kiln_sdk::Error::from)?) } else { call };
    let outs: Vec<Ident> = (0..node.outputs.len()).map(|i| format_ident!("__kiln_out{i}")).collect();
    let converts = node.outputs.iter().zip(&outs).map(|(ty, out)| quote_spanned!(ty.span()=> <#ty as ::kiln_sdk::typed::NodeOutput>::into_output(#out)));
    let bind = match outs.len() {
        1 => quote!(let #(#outs)* = #call;),
        _ => quote!(let (#(#outs),*) = #call;),
    };
    quote! {
        // Bound first: a parameter may have the function's own name.
        let __kiln_node = #fn_name;
        #(#takes)*
        #bind
        ::core::result::Result::Ok(::std::vec![#(#converts),*])
    }
}

/// `image_invert` → `ImageInvert`.
fn upper_camel(snake: &str) -> String {
    snake
        .split('_')
        .filter(|w| !w.is_empty())
        .map(|w| {
            let mut chars = w.chars();
            chars.next().map(|c| c.to_uppercase().chain(chars).collect::<String>()).unwrap_or_default()
        })
        .collect()
}
