//! Semantic checks: do the arguments fit together, and does the key template
//! fit the function it is put on? The answer is a [`Config`], the only thing
//! expansion reads (as thiserror's `valid.rs` and tokio's `FinalConfig`).

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote};
use syn::{FnArg, Pat};

use crate::errors::Errors;
use crate::input::{Body, LockFn};
use crate::key::KeyTemplate;
use std::time::Duration;

use crate::parse::{DurationArg, LockArgs, Mode};

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

/// Adds to `errors` every rule of `lock_limits::check` the literal
/// arguments break, with the runtime's message, at the argument the rule
/// names; what depends on an expression is left to the runtime.
fn check_options(args: &LockArgs, errors: &mut Errors) {
    let permits = args.permits.as_ref().map(|(expr, span)| {
        let value = match expr {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Int(lit),
                ..
            }) => lit.base10_parse::<u32>().ok().map(|n| (n, lit.span())),
            _ => None,
        };
        value.unwrap_or((1, *span))
    });
    let span_of = |option: &str| -> Span {
        let duration = |arg: &Option<DurationArg>| arg.as_ref().map(DurationArg::span);
        match option {
            "ttl" => duration(&args.ttl),
            "wait_timeout" => duration(&args.wait_timeout),
            "hold_at_least" => duration(&args.hold_at_least),
            "max_hold" => duration(&args.max_hold),
            "permits" => permits.map(|(_, span)| span),
            _ => None,
        }
        .unwrap_or_else(Span::call_site)
    };
    let mut report = |rule: Result<(), lock_limits::Problem>| {
        if let Err(problem) = rule {
            errors.push(syn::Error::new(
                span_of(problem.option()),
                problem.to_string(),
            ));
        }
    };
    let literal = |arg: &Option<DurationArg>| {
        arg.as_ref()
            .and_then(DurationArg::millis)
            .map(Duration::from_millis)
    };
    let ttl = args.ttl_millis().map(Duration::from_millis);
    for (option, value) in [
        ("ttl", &args.ttl),
        ("wait_timeout", &args.wait_timeout),
        ("hold_at_least", &args.hold_at_least),
        ("max_hold", &args.max_hold),
    ] {
        report(lock_limits::within_limit(option, literal(value)));
    }
    if let Some(ttl) = literal(&args.ttl) {
        report(lock_limits::ttl_long_enough(ttl));
    }
    if let Some((permits, _)) = permits {
        report(lock_limits::permits_fit(permits, args.read_access()));
    }
    // Only whether a wait timeout is given matters, not its value.
    let wait_given = args.wait_timeout.as_ref().map(|_| Duration::ZERO);
    report(lock_limits::waits_only_when_waiting(
        args.mode() == Mode::Skip,
        wait_given,
    ));
    if let (Some(hold), Some(ttl)) = (literal(&args.hold_at_least), ttl) {
        report(lock_limits::hold_fits(hold, ttl));
    }
    if args.max_hold.is_some() {
        let watchdog = lock_limits::max_hold_has_a_watchdog(args.watchdog());
        let watchdog_missing = watchdog.is_err();
        report(watchdog);
        if let (false, Some(max_hold), Some(ttl)) = (watchdog_missing, literal(&args.max_hold), ttl)
        {
            report(lock_limits::max_hold_fits(max_hold, ttl));
        }
    }
}

/// Whether every option is known at compile time (literals, or not
/// given): then the whole spec is checked there.
pub(crate) fn all_literal(config: &Config) -> bool {
    let literal = |arg: &Option<DurationArg>| arg.as_ref().is_none_or(|arg| arg.millis().is_some());
    literal(&config.ttl)
        && literal(&config.wait_timeout)
        && literal(&config.hold_at_least)
        && literal(&config.max_hold)
        && config.permits.as_ref().is_none_or(|expr| {
            matches!(
                expr,
                syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Int(_),
                    ..
                })
            )
        })
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

#[cfg(test)]
mod tests {
    use crate::expand::distributed_lock;

    /// The compile errors `args` on a plain `async fn run(id: u64)` give.
    fn errors(args: &str) -> String {
        let item = "async fn run(id: u64) {}";
        distributed_lock(args.parse().unwrap(), item.parse().unwrap()).to_string()
    }

    #[test]
    fn literal_options_break_the_runtimes_rules_with_its_messages() {
        for (args, message) in [
            (r#"key = "k", ttl = "0s""#, "`ttl` 0ns is shorter than 1ms"),
            (
                r#"key = "k", ttl = "100000h""#,
                "`ttl` is longer than ten years",
            ),
            (r#"key = "k", permits = 0"#, "`permits` must be at least 1"),
            (
                r#"key = "k", permits = 3, access = "read""#,
                "`permits` (3) and read access cannot be combined",
            ),
            (
                r#"key = "k", mode = "skip", wait_timeout = "1s""#,
                "`wait_timeout` has no effect on a single attempt",
            ),
            (
                r#"key = "k", ttl = "10s", hold_at_least = "1m""#,
                "`hold_at_least` 60s is longer than `ttl` 10s",
            ),
            (
                r#"key = "k", max_hold = "1m", watchdog = false"#,
                "`max_hold` limits the watchdog's renewals",
            ),
            (
                r#"key = "k", max_hold = "10s""#,
                "`max_hold` 10s is shorter than `ttl` 30s",
            ),
        ] {
            let out = errors(args);
            assert!(out.contains("compile_error"), "{args}: {out}");
            assert!(out.contains(message), "{args}: {out}");
        }
    }

    #[test]
    fn what_the_rules_allow_compiles_to_a_spec_checked_once() {
        for args in [
            r#"key = "k", permits = 3, access = "write""#,
            r#"key = "k", wait_timeout = "0s", hold_at_least = "0s""#,
            r#"key = "k", ttl = "10s", hold_at_least = "10s", max_hold = "10s""#,
        ] {
            let out = errors(args);
            assert!(!out.contains("compile_error"), "{args}: {out}");
            assert!(out.contains("const __LOCK_SPEC"), "{args}: {out}");
        }
        // An expression is the runtime's to check, when the call runs.
        let out = errors(r#"key = "k", ttl = TTL"#);
        assert!(!out.contains("__LOCK_SPEC"), "{out}");
        assert!(out.contains(". unchecked ()"), "{out}");
    }
}
