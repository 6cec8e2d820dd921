//! Reading a `#[node]` function: the attribute's options, each parameter's
//! input options, and the outputs its return type declares.

use proc_macro2::Span;
use syn::meta::ParseNestedMeta;
use syn::spanned::Spanned;
use syn::{Error, Expr, FnArg, Ident, LitStr, Pat, ReturnType, Type};

/// The options of `#[node(..)]`.
#[derive(Default)]
pub struct NodeOptions {
    pub class: Option<LitStr>,
    pub category: Option<LitStr>,
    pub display_name: Option<LitStr>,
    pub description: Option<LitStr>,
    /// Output names, with the span to blame for a count mismatch.
    pub outputs: Option<(Vec<LitStr>, Span)>,
    pub search_aliases: Vec<LitStr>,
    /// Flags: `output_node`, `deprecated`, `experimental`, `api_node`.
    pub flags: Vec<Ident>,
    /// `dynamic_combo(INPUT, OPTIONS)`, as two expressions.
    pub dynamic_combos: Vec<(Expr, Expr)>,
}

const NODE_OPTIONS: &str =
    "class, category, display_name, description, outputs, search_aliases, output_node, deprecated, experimental, api_node, dynamic_combo";
const FLAGS: [&str; 4] = ["output_node", "deprecated", "experimental", "api_node"];

impl NodeOptions {
    /// Reads one option of `#[node(..)]`.
    pub fn parse(&mut self, meta: ParseNestedMeta) -> syn::Result<()> {
        let Some(key) = meta.path.get_ident().cloned() else { return Err(meta.error(format!("expected one of: {NODE_OPTIONS}"))) };
        match key.to_string().as_str() {
            "class" => self.class = Some(meta.value()?.parse()?),
            "category" => self.category = Some(meta.value()?.parse()?),
            "display_name" => self.display_name = Some(meta.value()?.parse()?),
            "description" => self.description = Some(meta.value()?.parse()?),
            "outputs" => {
                let list = meta.value()?.parse::<syn::ExprArray>()?;
                self.outputs = Some((string_list(&list)?, list.span()));
            }
            "search_aliases" => self.search_aliases = string_list(&meta.value()?.parse()?)?,
            flag if FLAGS.contains(&flag) => self.flags.push(key),
            "dynamic_combo" => {
                let content;
                syn::parenthesized!(content in meta.input);
                let input: Expr = content.parse()?;
                content.parse::<syn::Token![,]>()?;
                let options: Expr = content.parse()?;
                self.dynamic_combos.push((input, options));
            }
            other => return Err(Error::new(key.span(), format!("unknown node option `{other}`; expected one of: {NODE_OPTIONS}"))),
        }
        Ok(())
    }
}

fn string_list(list: &syn::ExprArray) -> syn::Result<Vec<LitStr>> {
    list.elems
        .iter()
        .map(|e| match e {
            Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(s), .. }) => Ok(s.clone()),
            other => Err(Error::new(other.span(), "expected a string literal")),
        })
        .collect()
}

/// One widget or socket option of `#[input(..)]`.
pub enum InputOption {
    /// `default`, `min`, `max`, `step`, `round`, `display`, `tooltip` and
    /// `choices`: the option's name and value.
    Valued(Ident, Expr),
    /// `multiline`, `single_line`, `control_after_generate`, `image_upload`.
    Flag(Ident),
}

const INPUT_OPTIONS: &str = "name, default, min, max, step, round, display, tooltip, choices, multiline, single_line, control_after_generate, image_upload";
const VALUED: [&str; 8] = ["default", "min", "max", "step", "round", "display", "tooltip", "choices"];
const INPUT_FLAGS: [&str; 4] = ["multiline", "single_line", "control_after_generate", "image_upload"];

/// What the host fills into a `#[hidden]` parameter.
pub const HIDDEN: [(&str, &str); 3] = [("prompt", "Prompt"), ("extra_pnginfo", "ExtraPnginfo"), ("unique_id", "UniqueId")];

/// One parameter of the function.
pub struct Param {
    /// The variable the function binds.
    pub ident: Ident,
    /// The input's type (`T` of a `&T` parameter; `String` of `&str`).
    pub ty: Type,
    /// The function borrows the input (`&T`): it is passed as `&value`.
    pub by_ref: bool,
    /// The input's name in workflows (`name = ".."`, else the variable's).
    pub name: LitStr,
    /// `Some(variant)` for a `#[hidden]` parameter: a `Hidden` variant name.
    pub hidden: Option<Ident>,
    pub options: Vec<InputOption>,
}

/// A `#[node]` function, read.
pub struct Node {
    pub options: NodeOptions,
    pub params: Vec<Param>,
    /// Whether the function returns a `Result` (its error is converted).
    pub fallible: bool,
    /// The output types, in order (the tuple's elements, or the one type).
    pub outputs: Vec<Type>,
}

impl Node {
    /// Reads `function`, taking the `#[input]` and `#[hidden]` attributes off
    /// its parameters.
    pub fn new(options: NodeOptions, function: &mut syn::ItemFn) -> syn::Result<Node> {
        // Parameters first: their attributes come off even when something
        // else is wrong, so each mistake is reported once.
        let mut params = Vec::new();
        let mut errors: Option<Error> = None;
        for arg in function.sig.inputs.iter_mut() {
            match param(arg) {
                Ok(p) => params.push(p),
                Err(e) => match &mut errors {
                    Some(all) => all.combine(e),
                    None => errors = Some(e),
                },
            }
        }
        if let Some(e) = errors {
            return Err(e);
        }
        let sig = &function.sig;
        if let Some(token) = &sig.asyncness {
            return Err(Error::new(token.span(), "a node function cannot be async"));
        }
        if !sig.generics.params.is_empty() {
            return Err(Error::new(sig.generics.span(), "a node function cannot be generic: each input needs one type"));
        }
        let (fallible, outputs) = outputs(&sig.output)?;
        if let Some((names, span)) = &options.outputs
            && names.len() != outputs.len()
        {
            return Err(Error::new(*span, format!("`outputs` names {} outputs but the function returns {}", names.len(), outputs.len())));
        }
        Ok(Node { options, params, fallible, outputs })
    }
}

/// `(fallible, output types)` of a return type: `Result<T>` is fallible,
/// a tuple is several outputs, `()` or nothing none.
fn outputs(ret: &ReturnType) -> syn::Result<(bool, Vec<Type>)> {
    let ty = match ret {
        ReturnType::Default => return Ok((false, Vec::new())),
        ReturnType::Type(_, ty) => ty.as_ref(),
    };
    let (fallible, ty) = match ok_type(ty) {
        Some(inner) => (true, inner),
        None => (false, ty),
    };
    let types = match ty {
        Type::Tuple(tuple) => tuple.elems.iter().cloned().collect(),
        Type::Paren(inner) => vec![(*inner.elem).clone()],
        other => vec![other.clone()],
    };
    Ok((fallible, types))
}

/// `T` of a `Result<T>` or `Result<T, E>` (by the last path segment's name).
fn ok_type(ty: &Type) -> Option<&Type> {
    let Type::Path(path) = ty else { return None };
    let last = path.path.segments.last()?;
    if last.ident != "Result" {
        return None;
    }
    let syn::PathArguments::AngleBracketed(args) = &last.arguments else { return None };
    args.args.iter().find_map(|a| match a {
        syn::GenericArgument::Type(t) => Some(t),
        _ => None,
    })
}

/// Reads one parameter, taking its `#[input]`/`#[hidden]` attributes off.
fn param(arg: &mut FnArg) -> syn::Result<Param> {
    let FnArg::Typed(typed) = arg else { return Err(Error::new(arg.span(), "a node function takes no `self`")) };
    let Pat::Ident(pat) = typed.pat.as_ref() else {
        return Err(Error::new(typed.pat.span(), "each input must be a plain name (it is the input's name)"));
    };
    let ident = pat.ident.clone();
    let variable = ident.to_string();
    let variable = variable.strip_prefix("r#").unwrap_or(&variable);
    let mut name = LitStr::new(variable, ident.span());
    let mut options = Vec::new();
    let mut hidden = None;
    let mut kept = Vec::new();
    for attr in typed.attrs.drain(..) {
        if attr.path().is_ident("hidden") {
            attr.meta.require_path_only()?;
            // An unused hidden value may be bound as `_unique_id`.
            let wanted = name.value();
            let wanted = wanted.strip_prefix('_').unwrap_or(&wanted).to_string();
            name = LitStr::new(&wanted, ident.span());
            let Some((_, variant)) = HIDDEN.iter().find(|(n, _)| *n == wanted) else {
                let known: Vec<&str> = HIDDEN.iter().map(|(n, _)| *n).collect();
                return Err(Error::new(ident.span(), format!("a hidden input is one of: {}", known.join(", "))));
            };
            hidden = Some(Ident::new(variant, ident.span()));
        } else if attr.path().is_ident("input") {
            attr.parse_nested_meta(|meta| {
                let Some(key) = meta.path.get_ident().cloned() else { return Err(meta.error(format!("expected one of: {INPUT_OPTIONS}"))) };
                let k = key.to_string();
                if k == "name" {
                    name = meta.value()?.parse()?;
                } else if VALUED.contains(&k.as_str()) {
                    options.push(InputOption::Valued(key, meta.value()?.parse()?));
                } else if INPUT_FLAGS.contains(&k.as_str()) {
                    options.push(InputOption::Flag(key));
                } else {
                    return Err(Error::new(key.span(), format!("unknown input option `{k}`; expected one of: {INPUT_OPTIONS}")));
                }
                Ok(())
            })?;
        } else {
            kept.push(attr);
        }
    }
    typed.attrs = kept;
    if hidden.is_some() && !options.is_empty() {
        return Err(Error::new(ident.span(), "a hidden input has no widget options"));
    }
    let (ty, by_ref) = match typed.ty.as_ref() {
        Type::Reference(r) if r.mutability.is_none() => match r.elem.as_ref() {
            Type::Path(p) if p.path.is_ident("str") => (syn::parse_quote_spanned!(p.span()=> ::std::string::String), true),
            elem => (elem.clone(), true),
        },
        other => (other.clone(), false),
    };
    Ok(Param { ident, ty, by_ref, name, hidden, options })
}
