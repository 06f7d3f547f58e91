//! Semantic checks: do the arguments fit together, and does the key template
//! fit the function it is put on? The answer is a [`Config`], the only thing
//! expansion reads (as thiserror's `valid.rs` and tokio's `FinalConfig`).

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote};
use syn::{FnArg, Pat};

use crate::errors::Errors;
use crate::input::{Body, LockFn};
use crate::key::KeyTemplate;
use crate::parse::{DEFAULT_TTL_MILLIS, DurationArg, LockArgs, Mode};

/// The checked arguments, in the form expansion needs them.
pub(crate) struct Config {
    /// The key templates: one for `key`, several for `keys`.
    pub(crate) keys: Vec<KeyTemplate>,
    /// `keys = [..]` was given (several locks at once).
    pub(crate) multi: bool,
    pub(crate) mode: Mode,
    /// The runtime crate's path: `::lock_runtime` unless `crate = ".."`.
    pub(crate) krate: TokenStream,
    /// The durations: literals checked here, or expressions checked by the
    /// runtime; `None` for an argument not given (the ttl then defaults).
    pub(crate) ttl: Option<DurationArg>,
    pub(crate) wait_timeout: Option<DurationArg>,
    pub(crate) hold_at_least: Option<DurationArg>,
    pub(crate) watchdog: bool,
    /// `fencing = false`: no fencing token.
    pub(crate) fencing: bool,
    pub(crate) max_hold: Option<DurationArg>,
    /// `on_lost = "notify"`: a lost lease lets the body finish.
    pub(crate) notify_on_lost: bool,
    /// `permits = N`: a semaphore.
    pub(crate) permits: Option<syn::Expr>,
    /// `access = "read"`: a read lock.
    pub(crate) read: bool,
    /// `registry = expr`, or the global registry.
    pub(crate) registry: Option<syn::Expr>,
    /// `errors = "into"`: keep the body's `Result<T, E>`.
    pub(crate) errors_into: bool,
    /// The lock's name in metrics: `name = ".."`, or the key template(s).
    pub(crate) name: String,
}

/// Checks the arguments against each other and against the function, joining
/// every independent error into one.
pub(crate) fn validate(args: LockArgs, func: &LockFn) -> syn::Result<Config> {
    let keys = check(&args, func)?;
    let multi = args.keys.is_some();
    let watchdog = args.watchdog();
    let fencing = args.fencing();
    let errors_into = args.errors_into();
    let notify_on_lost = args.notify_on_lost();
    let read = args.read_access();
    let name = match &args.name {
        Some(name) => name.value(),
        None => keys
            .iter()
            .map(|template| template.lit.value())
            .collect::<Vec<_>>()
            .join(", "),
    };
    Ok(Config {
        keys,
        multi,
        mode: args.mode(),
        krate: args
            .krate
            .as_ref()
            .map_or_else(|| quote!(::lock_runtime), ToTokens::to_token_stream),
        ttl: args.ttl,
        wait_timeout: args.wait_timeout,
        hold_at_least: args.hold_at_least,
        watchdog,
        fencing,
        max_hold: args.max_hold,
        notify_on_lost,
        permits: args.permits.map(|(expr, _)| expr),
        read,
        registry: args.registry,
        errors_into,
        name,
    })
}

fn check(args: &LockArgs, func: &LockFn) -> syn::Result<Vec<KeyTemplate>> {
    let mut errors = Errors::default();
    errors.take(check_function(func));
    check_options(args, &mut errors);
    let templates: Option<Vec<KeyTemplate>> = match (&args.key, &args.keys) {
        (Some(_), Some((_, span))) => {
            errors.push(syn::Error::new(
                *span,
                "give `key` for one lock or `keys` for several, not both",
            ));
            None
        }
        (None, None) => {
            errors.push(syn::Error::new(
                Span::call_site(),
                "missing required `key` argument, e.g. `key = \"order:{id}\"`",
            ));
            None
        }
        (Some(template), None) => Some(vec![template.clone()]),
        (None, Some((templates, _))) => Some(templates.clone()),
    };
    for template in templates.iter().flatten() {
        errors.take(check_key(template, func));
    }
    // No templates means an error was added.
    errors.or(templates.unwrap_or_default())
}

fn check_function(func: &LockFn) -> syn::Result<()> {
    let sig = &func.sig;
    if let Some(constness) = &sig.constness {
        return Err(syn::Error::new(
            constness.span,
            "`#[distributed_lock]` cannot be used on a `const fn`; locking needs an `async fn`",
        ));
    }
    if sig.asyncness.is_none() && !matches!(func.body, Body::AsyncTrait { .. }) {
        return Err(syn::Error::new(
            sig.fn_token.span,
            "`#[distributed_lock]` requires an `async fn`",
        ));
    }
    Ok(())
}

/// Adds to `errors` every way the options contradict each other.
fn check_options(args: &LockArgs, errors: &mut Errors) {
    let ttl = args.ttl_millis();
    if let (Some((_, permits)), Some(_)) = (&args.permits, &args.access) {
        errors.push(syn::Error::new(
            *permits,
            "`permits` and `access` cannot be combined: a key is a semaphore (`permits`) or a read-write lock (`access`)",
        ));
    }
    if let (Mode::Skip, Some(wait)) = (args.mode(), &args.wait_timeout) {
        errors.push(syn::Error::new(
            wait.span(),
            "`wait_timeout` has no effect in skip mode, which never waits; remove it or use `mode = \"wait\"`",
        ));
    }
    // Compared only when both are literals; the runtime checks the rest.
    let longer = |value: &DurationArg| matches!((value.millis(), ttl), (Some(v), Some(t)) if v > t);
    let shorter =
        |value: &DurationArg| matches!((value.millis(), ttl), (Some(v), Some(t)) if v < t);
    if let Some(hold) = args.hold_at_least.as_ref().filter(|hold| longer(hold)) {
        errors.push(syn::Error::new(
            hold.span(),
            format!(
                "`hold_at_least` ({}) is longer than `ttl` ({}); the lease would expire before it",
                show(hold),
                show_ttl(args)
            ),
        ));
    }
    if let Some(max_hold) = &args.max_hold {
        if !args.watchdog() {
            errors.push(syn::Error::new(
                max_hold.span(),
                "`max_hold` limits the watchdog's renewals and has no effect with `watchdog = false`; the `ttl` already bounds the hold",
            ));
        } else if shorter(max_hold) {
            errors.push(syn::Error::new(
                max_hold.span(),
                format!(
                    "`max_hold` ({}) is shorter than `ttl` ({}); use a shorter `ttl` instead",
                    show(max_hold),
                    show_ttl(args)
                ),
            ));
        }
    }
}

fn show(value: &DurationArg) -> String {
    value.shown()
}

fn show_ttl(args: &LockArgs) -> String {
    args.ttl.as_ref().map_or_else(
        || format!("default \"{}s\"", DEFAULT_TTL_MILLIS / 1000),
        show,
    )
}

/// Every placeholder root must be `self` (on a method) or a name a
/// parameter's pattern binds (`id`, or `item` in `Path(item): Path<u64>`).
fn check_key(template: &KeyTemplate, func: &LockFn) -> syn::Result<()> {
    let sig = &func.sig;
    let mut params = Vec::new();
    let mut has_self = false;
    for input in &sig.inputs {
        match input {
            FnArg::Receiver(_) => has_self = true,
            FnArg::Typed(typed) => bound_names(&typed.pat, &mut params),
        }
    }
    let fn_name = &sig.ident;
    for root in template.roots() {
        if root == "self" {
            if !has_self {
                return Err(syn::Error::new(
                    template.lit.span(),
                    format!(
                        "key template refers to `self`, but `{fn_name}` has no `self` parameter"
                    ),
                ));
            }
        } else if !params.iter().any(|param| param == root) {
            let hint = if params.is_empty() {
                String::new()
            } else {
                format!("; parameters are {}", list(&params))
            };
            return Err(syn::Error::new(
                template.lit.span(),
                format!(
                    "key template refers to `{root}`, which is not a parameter of `{fn_name}`{hint}"
                ),
            ));
        }
    }
    Ok(())
}

/// The names a parameter pattern binds: `id` in `id: u64`, `item` in
/// `Path(item): Path<u64>`, `app` in `State(app): State<App>`, the fields of
/// a struct pattern, and so on, at any depth.
fn bound_names(pat: &Pat, names: &mut Vec<String>) {
    match pat {
        Pat::Ident(pat) => {
            names.push(pat.ident.to_string());
            if let Some((_, sub)) = &pat.subpat {
                bound_names(sub, names);
            }
        }
        Pat::TupleStruct(pat) => pat.elems.iter().for_each(|elem| bound_names(elem, names)),
        Pat::Tuple(pat) => pat.elems.iter().for_each(|elem| bound_names(elem, names)),
        Pat::Struct(pat) => pat
            .fields
            .iter()
            .for_each(|field| bound_names(&field.pat, names)),
        Pat::Reference(pat) => bound_names(&pat.pat, names),
        Pat::Slice(pat) => pat.elems.iter().for_each(|elem| bound_names(elem, names)),
        Pat::Paren(pat) => bound_names(&pat.pat, names),
        Pat::Type(pat) => bound_names(&pat.pat, names),
        _ => {}
    }
}

fn list(names: &[String]) -> String {
    names
        .iter()
        .map(|name| format!("`{name}`"))
        .collect::<Vec<_>>()
        .join(", ")
}
