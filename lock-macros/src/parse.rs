//! Parsing of the attribute's arguments: `key = "…", mode = "skip", ttl = "30s", …`.
//!
//! Durations are a string literal (checked here) or any expression of type
//! `Duration` (checked by the runtime when the call runs); `registry` is an
//! expression.
//!
//! Only syntax and the shape of each value are checked here; how the values
//! fit together and with the function is checked in `valid.rs`.

use proc_macro2::{Span, TokenTree};
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::{Ident, LitBool, LitStr, Token};

use crate::errors::Errors;
use crate::key::KeyTemplate;

/// The argument names, in the order the error message lists them.
pub(crate) const ARGUMENTS: &[&str] = &[
    "key",
    "keys",
    "mode",
    "ttl",
    "wait_timeout",
    "hold_at_least",
    "watchdog",
    "fencing",
    "max_hold",
    "on_lost",
    "permits",
    "access",
    "registry",
    "errors",
    "name",
    "crate",
];

/// The lease length when `ttl` is not given, in milliseconds: the
/// runtime's default.
pub(crate) const DEFAULT_TTL_MILLIS: u64 = lock_limits::DEFAULT_TTL.as_millis() as u64;

mod kw {
    syn::custom_keyword!(key);
    syn::custom_keyword!(keys);
    syn::custom_keyword!(mode);
    syn::custom_keyword!(ttl);
    syn::custom_keyword!(wait_timeout);
    syn::custom_keyword!(hold_at_least);
    syn::custom_keyword!(watchdog);
    syn::custom_keyword!(fencing);
    syn::custom_keyword!(max_hold);
    syn::custom_keyword!(on_lost);
    syn::custom_keyword!(permits);
    syn::custom_keyword!(access);
    syn::custom_keyword!(registry);
    syn::custom_keyword!(errors);
    syn::custom_keyword!(name);
}

/// What to do when the lock is held elsewhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Wait for the lock (the default).
    Wait,
    /// Make one attempt; return `Ok(None)` when the lock is held.
    Skip,
}

/// A duration argument: its value in milliseconds and the literal it came from.
#[derive(Clone)]
pub(crate) struct Millis {
    pub(crate) millis: u64,
    pub(crate) lit: LitStr,
}

/// A duration argument: a literal, or an expression of type `Duration`.
#[derive(Clone)]
pub(crate) enum DurationArg {
    Literal(Millis),
    Expr(Box<syn::Expr>),
}

impl DurationArg {
    pub(crate) fn span(&self) -> Span {
        match self {
            DurationArg::Literal(millis) => millis.lit.span(),
            DurationArg::Expr(expr) => syn::spanned::Spanned::span(expr),
        }
    }

    /// The literal's value; `None` for an expression (known at run time).
    pub(crate) fn millis(&self) -> Option<u64> {
        match self {
            DurationArg::Literal(millis) => Some(millis.millis),
            DurationArg::Expr(_) => None,
        }
    }
}

/// The parsed arguments of `#[distributed_lock(..)]`, each with its span.
#[derive(Default)]
pub(crate) struct LockArgs {
    /// The key template, scanned here so its errors join the others.
    pub(crate) key: Option<KeyTemplate>,
    /// `keys = ["…", "…"]`: several locks at once (with the span of the
    /// argument).
    pub(crate) keys: Option<(Vec<KeyTemplate>, Span)>,
    pub(crate) mode: Option<(Mode, Span)>,
    pub(crate) ttl: Option<DurationArg>,
    pub(crate) wait_timeout: Option<DurationArg>,
    pub(crate) hold_at_least: Option<DurationArg>,
    pub(crate) watchdog: Option<LitBool>,
    /// `fencing = false`: no fencing token (0), and no work to make one.
    pub(crate) fencing: Option<LitBool>,
    pub(crate) max_hold: Option<DurationArg>,
    /// `on_lost = "notify"` (`true`) or `"cancel"`: whether a lost lease
    /// lets the body finish rather than cancelling it.
    pub(crate) on_lost: Option<(bool, Span)>,
    /// `permits = N`: a semaphore of N (an integer literal, checked here,
    /// or a `u32` expression), with the argument's span.
    pub(crate) permits: Option<(syn::Expr, Span)>,
    /// `access = "read"` (`true`) or `"write"`, with the argument's span.
    pub(crate) access: Option<(bool, Span)>,
    /// `registry = expr`: a registry other than the global one.
    pub(crate) registry: Option<syn::Expr>,
    /// `errors = "into"` (its span) or `"nested"`: whether a body's
    /// `Result<T, E>` keeps its error type, `LockError` converted into `E`.
    pub(crate) errors: Option<(bool, Span)>,
    /// `name = ".."`: the lock's name in metrics (default: the key
    /// template).
    pub(crate) name: Option<LitStr>,
    pub(crate) krate: Option<syn::Path>,
}

impl LockArgs {
    pub(crate) fn mode(&self) -> Mode {
        self.mode.map_or(Mode::Wait, |(mode, _)| mode)
    }

    /// The ttl in milliseconds if known at compile time (a literal, or
    /// the default).
    pub(crate) fn ttl_millis(&self) -> Option<u64> {
        self.ttl
            .as_ref()
            .map_or(Some(DEFAULT_TTL_MILLIS), DurationArg::millis)
    }

    /// Whether `errors = "into"` was given.
    pub(crate) fn errors_into(&self) -> bool {
        self.errors.is_some_and(|(into, _)| into)
    }

    /// Whether `access = "read"` was given.
    pub(crate) fn read_access(&self) -> bool {
        self.access.is_some_and(|(read, _)| read)
    }

    /// Whether `on_lost = "notify"` was given.
    pub(crate) fn notify_on_lost(&self) -> bool {
        self.on_lost.is_some_and(|(notify, _)| notify)
    }

    pub(crate) fn watchdog(&self) -> bool {
        self.watchdog.as_ref().is_none_or(LitBool::value)
    }

    pub(crate) fn fencing(&self) -> bool {
        self.fencing.as_ref().is_none_or(LitBool::value)
    }
}

/// Stores `value` in `slot` unless the argument was already given.
pub(crate) fn set_once<T>(
    slot: &mut Option<T>,
    value: T,
    span: Span,
    name: &str,
) -> syn::Result<()> {
    if slot.is_some() {
        return Err(syn::Error::new(
            span,
            format!("duplicate `{name}` argument"),
        ));
    }
    *slot = Some(value);
    Ok(())
}

impl Parse for LockArgs {
    /// Every value error at once; the first syntax error alone.
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let (args, errors) = LockArgs::parse_with(input, false)?;
        errors.or(args)
    }
}

impl LockArgs {
    /// What can be read of arguments that may be wrong: every argument that
    /// parses, past any that does not. The fallback expansion reads the
    /// mode, `errors` and `crate` from it.
    pub(crate) fn parse_lenient(input: ParseStream<'_>) -> syn::Result<Self> {
        Ok(LockArgs::parse_with(input, true)?.0)
    }

    /// Parses the arguments, collecting value errors. A syntax error ends
    /// the parse unless `recover`, which skips to the next argument.
    fn parse_with(input: ParseStream<'_>, recover: bool) -> syn::Result<(LockArgs, Errors)> {
        let mut args = LockArgs::default();
        let mut errors = Errors::default();
        while !input.is_empty() {
            let parsed = args.parse_one(input).and_then(|value| {
                errors.take(value);
                if input.is_empty() {
                    Ok(())
                } else {
                    input.parse::<Token![,]>().map(drop)
                }
            });
            if let Err(syntax) = parsed {
                if !recover {
                    return Err(syntax);
                }
                errors.push(syntax);
                skip_argument(input)?;
            }
        }
        Ok((args, errors))
    }

    /// Parses one `name = value` into `self`: a syntax error as the outer
    /// error, a bad or duplicate value as the inner one.
    fn parse_one(&mut self, input: ParseStream<'_>) -> syn::Result<syn::Result<()>> {
        let args = self;
        let lookahead = input.lookahead1();
        let result = if lookahead.peek(kw::keys) {
            let span = input.parse::<kw::keys>()?.span;
            input.parse::<Token![=]>()?;
            let list;
            let bracket = syn::bracketed!(list in input);
            let lits = syn::punctuated::Punctuated::<LitStr, Token![,]>::parse_terminated(&list)?;
            if lits.is_empty() {
                Err(syn::Error::new(
                    bracket.span.join(),
                    "`keys` needs at least one key template, e.g. `keys = [\"acct:{from}\", \"acct:{to}\"]`",
                ))
            } else {
                lits.iter()
                    .map(KeyTemplate::parse)
                    .collect::<syn::Result<Vec<_>>>()
                    .and_then(|templates| set_once(&mut args.keys, (templates, span), span, "keys"))
            }
        } else if lookahead.peek(kw::key) {
            let span = input.parse::<kw::key>()?.span;
            let lit = parse_value::<LitStr>(input)?;
            KeyTemplate::parse(&lit)
                .and_then(|template| set_once(&mut args.key, template, span, "key"))
        } else if lookahead.peek(kw::mode) {
            let span = input.parse::<kw::mode>()?.span;
            let lit = parse_value::<LitStr>(input)?;
            parse_mode(&lit)
                .and_then(|mode| set_once(&mut args.mode, (mode, lit.span()), span, "mode"))
        } else if lookahead.peek(kw::ttl) {
            let span = input.parse::<kw::ttl>()?.span;
            duration_arg(input, &mut args.ttl, span, "ttl")?
        } else if lookahead.peek(kw::wait_timeout) {
            let span = input.parse::<kw::wait_timeout>()?.span;
            duration_arg(input, &mut args.wait_timeout, span, "wait_timeout")?
        } else if lookahead.peek(kw::hold_at_least) {
            let span = input.parse::<kw::hold_at_least>()?.span;
            duration_arg(input, &mut args.hold_at_least, span, "hold_at_least")?
        } else if lookahead.peek(kw::max_hold) {
            let span = input.parse::<kw::max_hold>()?.span;
            duration_arg(input, &mut args.max_hold, span, "max_hold")?
        } else if lookahead.peek(kw::on_lost) {
            let span = input.parse::<kw::on_lost>()?.span;
            let lit = parse_value::<LitStr>(input)?;
            let notify = one_of(&lit, "on_lost", [("cancel", false), ("notify", true)]);
            notify.and_then(|notify| {
                set_once(&mut args.on_lost, (notify, lit.span()), span, "on_lost")
            })
        } else if lookahead.peek(kw::permits) {
            let span = input.parse::<kw::permits>()?.span;
            let expr = parse_value::<syn::Expr>(input)?;
            check_permits(&expr)
                .and_then(|()| set_once(&mut args.permits, (expr, span), span, "permits"))
        } else if lookahead.peek(kw::access) {
            let span = input.parse::<kw::access>()?.span;
            let lit = parse_value::<LitStr>(input)?;
            let read = one_of(&lit, "access", [("read", true), ("write", false)]);
            read.and_then(|read| set_once(&mut args.access, (read, span), span, "access"))
        } else if lookahead.peek(kw::errors) {
            let span = input.parse::<kw::errors>()?.span;
            let lit = parse_value::<LitStr>(input)?;
            let into = one_of(&lit, "errors", [("into", true), ("nested", false)]);
            into.and_then(|into| set_once(&mut args.errors, (into, lit.span()), span, "errors"))
        } else if lookahead.peek(kw::name) {
            let span = input.parse::<kw::name>()?.span;
            let lit = parse_value::<LitStr>(input)?;
            if lit.value().is_empty() {
                Err(syn::Error::new(
                    lit.span(),
                    "a lock name must not be empty; it labels the lock's metrics, e.g. `name = \"stock\"`",
                ))
            } else {
                set_once(&mut args.name, lit, span, "name")
            }
        } else if lookahead.peek(kw::registry) {
            let span = input.parse::<kw::registry>()?.span;
            let expr = parse_value::<syn::Expr>(input)?;
            set_once(&mut args.registry, expr, span, "registry")
        } else if lookahead.peek(kw::watchdog) {
            let span = input.parse::<kw::watchdog>()?.span;
            let lit = parse_value::<LitBool>(input)?;
            set_once(&mut args.watchdog, lit, span, "watchdog")
        } else if lookahead.peek(kw::fencing) {
            let span = input.parse::<kw::fencing>()?.span;
            let lit = parse_value::<LitBool>(input)?;
            set_once(&mut args.fencing, lit, span, "fencing")
        } else if lookahead.peek(Token![crate]) {
            let span = input.parse::<Token![crate]>()?.span;
            let lit = parse_value::<LitStr>(input)?;
            crate_path(&lit).and_then(|path| set_once(&mut args.krate, path, span, "crate"))
        } else if input.peek(Ident::peek_any) {
            let ident = input.call(Ident::parse_any)?;
            let expected = ARGUMENTS
                .iter()
                .map(|name| format!("`{name}`"))
                .collect::<Vec<_>>()
                .join(", ");
            return Err(syn::Error::new(
                ident.span(),
                format!("unknown argument `{ident}`; expected one of {expected}"),
            ));
        } else {
            return Err(lookahead.error());
        };
        Ok(result)
    }
}

/// The path a `crate = ".."` argument names.
pub(crate) fn crate_path(lit: &LitStr) -> syn::Result<syn::Path> {
    lit.parse::<syn::Path>().map_err(|_| {
        syn::Error::new(
            lit.span(),
            format!(
                "invalid crate path {:?}; expected a path such as \"lock_runtime\"",
                lit.value()
            ),
        )
    })
}

/// Refuses a `permits` literal that is not a `u32`; its value's rules
/// (`lock_limits::check`) are applied in `valid.rs`, and any other
/// expression is checked by the compiler (its type) and the runtime (its
/// value).
fn check_permits(expr: &syn::Expr) -> syn::Result<()> {
    let syn::Expr::Lit(syn::ExprLit {
        lit: syn::Lit::Int(lit),
        ..
    }) = expr
    else {
        return Ok(());
    };
    match lit.base10_parse::<u32>() {
        Ok(_) => Ok(()),
        Err(_) => Err(syn::Error::new(
            lit.span(),
            format!(
                "`permits` must be from 1 to {}, got {}; 1 is a mutex",
                u32::MAX,
                lit.base10_digits()
            ),
        )),
    }
}

/// The meaning of a string argument `name` that takes one of two values,
/// each with its meaning; the error lists them in order.
fn one_of(lit: &LitStr, name: &str, values: [(&str, bool); 2]) -> syn::Result<bool> {
    let value = lit.value();
    match values.iter().find(|(text, _)| *text == value) {
        Some((_, meaning)) => Ok(*meaning),
        None => Err(syn::Error::new(
            lit.span(),
            format!(
                "unknown {name} {value:?}; expected {:?} or {:?}",
                values[0].0, values[1].0
            ),
        )),
    }
}

/// Skips the tokens up to and including the next top-level comma.
fn skip_argument(input: ParseStream<'_>) -> syn::Result<()> {
    input.step(|cursor| {
        let mut rest = *cursor;
        while let Some((tree, next)) = rest.token_tree() {
            rest = next;
            if matches!(&tree, TokenTree::Punct(punct) if punct.as_char() == ',') {
                break;
            }
        }
        Ok(((), rest))
    })
}

/// Parses `= VALUE`.
pub(crate) fn parse_value<T: Parse>(input: ParseStream<'_>) -> syn::Result<T> {
    input.parse::<Token![=]>()?;
    input.parse()
}

/// Parses `= "DURATION"` into `slot`. Syntax errors are returned as the outer
/// error; a bad or duplicate value as the inner one, so parsing can go on.
/// A string literal is checked now; any other expression must be a
/// `Duration` (the compiler checks its type, the runtime its value).
pub(crate) fn duration_arg(
    input: ParseStream<'_>,
    slot: &mut Option<DurationArg>,
    span: Span,
    name: &str,
) -> syn::Result<syn::Result<()>> {
    input.parse::<Token![=]>()?;
    if input.peek(syn::LitInt) || input.peek(syn::LitFloat) {
        let number: TokenTree = input.parse()?;
        return Err(syn::Error::new(
            number.span(),
            format!(
                "`{name}` takes a string with a unit, e.g. `{name} = \"{number}s\"`, or a `Duration`"
            ),
        ));
    }
    if input.peek(LitStr) {
        let lit: LitStr = input.parse()?;
        return Ok(parse_duration(&lit, name)
            .and_then(|millis| set_once(slot, DurationArg::Literal(millis), span, name)));
    }
    let expr: syn::Expr = input.parse()?;
    Ok(set_once(
        slot,
        DurationArg::Expr(Box::new(expr)),
        span,
        name,
    ))
}

fn parse_mode(lit: &LitStr) -> syn::Result<Mode> {
    match lit.value().as_str() {
        "wait" => Ok(Mode::Wait),
        "skip" => Ok(Mode::Skip),
        other => Err(syn::Error::new(
            lit.span(),
            format!("unknown mode {other:?}; expected \"wait\" or \"skip\""),
        )),
    }
}

/// Parses a duration such as `"500ms"`, `"30s"`, `"5m"`, `"2h"` or `"1m30s"`.
fn parse_duration(lit: &LitStr, name: &str) -> syn::Result<Millis> {
    let text = lit.value();
    let invalid = || {
        syn::Error::new(
            lit.span(),
            format!("invalid {name} {text:?}; expected e.g. \"500ms\", \"30s\", \"5m\", \"1m30s\""),
        )
    };
    // Its value's rules (`lock_limits::check`) are applied in `valid.rs`.
    let millis = duration_millis(&text).ok_or_else(invalid)?;
    Ok(Millis {
        millis,
        lit: lit.clone(),
    })
}

/// Sums `<digits><unit>` groups; `None` when the text is not of that form or
/// the sum overflows.
fn duration_millis(text: &str) -> Option<u64> {
    let mut rest = text;
    let mut total: u64 = 0;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let number: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let (factor, unit_len) = if rest.starts_with("ms") {
            (1, 2)
        } else if rest.starts_with('s') {
            (1_000, 1)
        } else if rest.starts_with('m') {
            (60_000, 1)
        } else if rest.starts_with('h') {
            (3_600_000, 1)
        } else {
            return None;
        };
        rest = &rest[unit_len..];
        total = total.checked_add(number.checked_mul(factor)?)?;
    }
    Some(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> syn::Result<LockArgs> {
        syn::parse_str::<LockArgs>(text)
    }

    fn error(text: &str) -> String {
        match parse(text) {
            Ok(_) => panic!("{text} parsed"),
            Err(err) => err.to_string(),
        }
    }

    #[test]
    fn parses_every_argument() {
        let args = parse(
            r#"key = "a:{id}", mode = "skip", ttl = "1m30s", hold_at_least = "10s",
               watchdog = false, fencing = false, max_hold = "10m", on_lost = "notify", crate = "my::locks""#,
        )
        .unwrap();
        assert_eq!(args.key.as_ref().unwrap().lit.value(), "a:{id}");
        assert_eq!(args.mode(), Mode::Skip);
        assert_eq!(args.ttl.as_ref().unwrap().millis(), Some(90_000));
        assert_eq!(args.hold_at_least.as_ref().unwrap().millis(), Some(10_000));
        assert!(!args.watchdog.as_ref().unwrap().value());
        assert!(!args.fencing());
        assert_eq!(args.max_hold.as_ref().unwrap().millis(), Some(600_000));
        assert!(args.notify_on_lost());
        let krate = args.krate.unwrap();
        assert_eq!(krate.segments.len(), 2);
    }

    #[test]
    fn defaults_apply_when_arguments_are_absent() {
        let args = parse(r#"key = "k""#).unwrap();
        assert_eq!(args.mode(), Mode::Wait);
        assert_eq!(args.ttl_millis(), Some(DEFAULT_TTL_MILLIS));
        assert!(args.watchdog());
        assert!(args.fencing());
        assert!(!args.notify_on_lost());
        assert!(args.wait_timeout.is_none());
    }

    #[test]
    fn a_name_labels_the_lock_and_must_not_be_empty() {
        let args = parse(r#"key = "stock:{id}", name = "stock""#).unwrap();
        assert_eq!(args.name.unwrap().value(), "stock");
        assert!(error(r#"key = "k", name = """#).contains("must not be empty"));
        assert!(error(r#"key = "k", name = "a", name = "b""#).contains("duplicate `name`"));
    }

    #[test]
    fn trailing_comma_is_accepted() {
        assert!(parse(r#"key = "k", "#).is_ok());
    }

    #[test]
    fn durations_in_every_unit() {
        assert_eq!(duration_millis("500ms"), Some(500));
        assert_eq!(duration_millis("30s"), Some(30_000));
        assert_eq!(duration_millis("5m"), Some(300_000));
        assert_eq!(duration_millis("2h"), Some(7_200_000));
        assert_eq!(duration_millis("1h1m1s1ms"), Some(3_661_001));
        assert_eq!(duration_millis(""), None);
        assert_eq!(duration_millis("30"), None);
        assert_eq!(duration_millis("s"), None);
        assert_eq!(duration_millis("1.5s"), None);
        assert_eq!(duration_millis("30 s"), None);
        assert_eq!(duration_millis("99999999999999999999s"), None);
        assert_eq!(duration_millis("18446744073709551615h"), None);
    }

    #[test]
    fn keys_take_a_list_of_templates() {
        let args = parse(r#"keys = ["acct:{from}", "acct:{to}",]"#).unwrap();
        let (templates, _) = args.keys.unwrap();
        assert_eq!(templates.len(), 2);
        assert!(error(r#"keys = []"#).contains("at least one key template"));
        assert!(parse(r#"keys = ["a:{"]"#).is_err());
    }

    #[test]
    fn unknown_argument_lists_the_valid_ones() {
        let msg = error(r#"key = "k", tll = "1s""#);
        assert!(msg.starts_with("unknown argument `tll`; expected one of `key`, `keys`, `mode`"));
        assert!(msg.contains("`crate`"));
    }

    #[test]
    fn duplicate_argument_is_an_error() {
        assert_eq!(
            error(r#"key = "k", ttl = "1s", ttl = "2s""#),
            "duplicate `ttl` argument"
        );
    }

    #[test]
    fn bad_values_name_the_value() {
        assert_eq!(
            error(r#"key = "k", mode = "block""#),
            r#"unknown mode "block"; expected "wait" or "skip""#
        );
        assert!(error(r#"key = "k", ttl = "30x""#).starts_with(r#"invalid ttl "30x""#));
        assert!(error(r#"key = "k", crate = "not a path""#).contains("invalid crate path"));
    }

    #[test]
    fn all_value_errors_are_reported_together() {
        let Err(err) = parse(r#"key = "k", mode = "block", ttl = "1x""#) else {
            panic!("parsed")
        };
        assert_eq!(err.into_iter().count(), 2);
    }

    #[test]
    fn wrong_literal_kind_is_a_syntax_error() {
        assert!(parse(r#"ttl = 30"#).is_err());
        assert!(parse(r#"watchdog = "no""#).is_err());
        assert!(parse(r#"fencing = "no""#).is_err());
    }

    #[test]
    fn durations_and_the_registry_may_be_expressions() {
        let args = parse(
            r#"key = "k", ttl = TTL, wait_timeout = Duration::from_secs(self.wait),
               registry = self.locks, hold_at_least = "1s""#,
        )
        .unwrap();
        assert!(matches!(args.ttl, Some(DurationArg::Expr(_))));
        assert_eq!(args.ttl_millis(), None);
        assert!(matches!(args.wait_timeout, Some(DurationArg::Expr(_))));
        assert_eq!(args.hold_at_least.as_ref().unwrap().millis(), Some(1_000));
        assert!(args.registry.is_some());
        assert_eq!(
            error(r#"key = "k", registry = a, registry = b"#),
            "duplicate `registry` argument"
        );
    }
}
