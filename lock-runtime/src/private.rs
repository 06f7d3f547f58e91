//! /!\ WARNING: This is *not* a stable API! /!\
//!
//! What `#[distributed_lock]` expansions call. It may change in any release,
//! which is why the macro crate is pinned to an exact version.

use std::fmt;
use std::future::Future;
use std::pin::pin;
use std::time::Duration;

use crate::error::LockError;
use crate::lock_all::LockGuards;
use crate::options::{Access, LockOptions, Mode, OnLost};
use crate::registry::LockRegistry;
use crate::section;
use crate::task_locks;
use crate::telemetry;

/// How long a rendered key may be and still be kept in the call's own
/// future rather than on the heap.
const INLINE_KEY: usize = 120;

/// A key rendered from its template for one call, kept in the call's own
/// future: borrowed when the template is one `&str` placeholder (or a
/// literal), in place when it is short (no allocation), on the heap when
/// not. The lock shares the key its local queue keeps, so a key locked
/// before is not copied again.
#[doc(hidden)]
pub struct RenderedKey<'a>(Rendered<'a>);

enum Rendered<'a> {
    /// A template without placeholders, or one whose only placeholder is
    /// a `&str` (or `&String`): the text as it is.
    Borrowed(&'a str),
    Inline(InlineKey),
    Heap(String),
}

/// A key written in place, whole `str`s at a time.
struct InlineKey {
    len: usize,
    bytes: [u8; INLINE_KEY],
}

impl fmt::Write for InlineKey {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        let end = self.len + text.len();
        let room = self.bytes.get_mut(self.len..end).ok_or(fmt::Error)?;
        room.copy_from_slice(text.as_bytes());
        self.len = end;
        Ok(())
    }
}

impl fmt::Debug for RenderedKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl RenderedKey<'_> {
    /// The key.
    pub fn as_str(&self) -> &str {
        match &self.0 {
            Rendered::Borrowed(key) => key,
            // Written by `write_str` only, whole `str`s: always UTF-8.
            Rendered::Inline(inline) => {
                std::str::from_utf8(&inline.bytes[..inline.len]).unwrap_or_default()
            }
            Rendered::Heap(key) => key,
        }
    }
}

/// Renders a key template's arguments, in place when the key is short.
/// A `Display` that fails leaves what it wrote so far, as `format!` would
/// not (it panics).
#[doc(hidden)]
pub fn render_key(args: fmt::Arguments<'_>) -> RenderedKey<'static> {
    if let Some(key) = args.as_str() {
        return RenderedKey(Rendered::Borrowed(key));
    }
    let mut inline = InlineKey {
        len: 0,
        bytes: [0; INLINE_KEY],
    };
    if fmt::Write::write_fmt(&mut inline, args).is_ok() {
        return RenderedKey(Rendered::Inline(inline));
    }
    let mut heap = String::with_capacity(2 * INLINE_KEY);
    let _ = fmt::Write::write_fmt(&mut heap, args);
    RenderedKey(Rendered::Heap(heap))
}

/// The value of a template that is one placeholder (`"{name}"`). The
/// attribute calls `(&KeyArg(&value)).rendered_lock_key()`: method lookup
/// takes [`KeyText`] when the value is a `&str` or `&String` (its text is
/// borrowed, not copied), and [`KeyDisplay`], one auto-reference further,
/// for any other `Display`. (The method's name is one no user trait in
/// scope is likely to share.)
#[doc(hidden)]
#[derive(Debug)]
pub struct KeyArg<'r, T: ?Sized>(pub &'r T);

/// A one-placeholder key whose value is text: borrowed.
#[doc(hidden)]
pub trait KeyText<'a> {
    fn rendered_lock_key(&self) -> RenderedKey<'a>;
}

impl<'a> KeyText<'a> for KeyArg<'_, &'a str> {
    fn rendered_lock_key(&self) -> RenderedKey<'a> {
        RenderedKey(Rendered::Borrowed(self.0))
    }
}

impl<'a> KeyText<'a> for KeyArg<'_, &'a String> {
    fn rendered_lock_key(&self) -> RenderedKey<'a> {
        RenderedKey(Rendered::Borrowed(self.0.as_str()))
    }
}

/// A one-placeholder key whose value is any other `Display`: rendered as
/// `format!("{}", value)` would write it. (The bound is the method's, so a
/// value that is not `Display` is reported as that.)
#[doc(hidden)]
pub trait KeyDisplay<T: ?Sized> {
    fn rendered_lock_key(&self) -> RenderedKey<'static>
    where
        T: fmt::Display;
}

impl<T: ?Sized> KeyDisplay<T> for &KeyArg<'_, T> {
    fn rendered_lock_key(&self) -> RenderedKey<'static>
    where
        T: fmt::Display,
    {
        render_key(format_args!("{}", self.0))
    }
}

/// The attribute's arguments, by name: a literal duration made
/// `Duration::from_millis(..)` at compile time, or the user's `Duration`
/// expression; `name` labels its metrics.
#[doc(hidden)]
#[derive(Clone, Copy, Debug)]
pub struct Args {
    pub ttl: Duration,
    pub wait_timeout: Option<Duration>,
    pub hold_at_least: Option<Duration>,
    pub watchdog: bool,
    pub max_hold: Option<Duration>,
    pub name: &'static str,
    pub on_lost: OnLost,
    pub permits: u32,
    pub access: Access,
    pub fencing: bool,
}

/// One call site's options, and whether their rules were checked already.
#[doc(hidden)]
#[derive(Clone, Debug)]
pub struct Spec {
    options: LockOptions,
    checked: bool,
}

impl Args {
    /// The spec of arguments that are all literals, checked here, at
    /// compile time (the attribute emits it as a `const`): the rules are
    /// `lock_limits::check`'s, which the attribute applied already to
    /// report the argument at fault, so this panic is only a backstop.
    /// `single_attempt` for skip mode.
    pub const fn checked(self, single_attempt: bool) -> Spec {
        let options = self.options();
        let mode = if single_attempt {
            Mode::Skip
        } else {
            Mode::Wait
        };
        if lock_limits::check(&options.rule_values(mode)).is_err() {
            panic!(
                "the options of this `#[distributed_lock]` break a rule of `lock_limits::check`"
            );
        }
        Spec {
            options,
            checked: true,
        }
    }

    /// The spec of arguments some of which are expressions: checked when
    /// the call runs.
    pub const fn unchecked(self) -> Spec {
        Spec {
            options: self.options(),
            checked: false,
        }
    }

    const fn options(self) -> LockOptions {
        LockOptions {
            fencing: self.fencing,
            permits: self.permits,
            access: self.access,
            ttl: self.ttl,
            wait_timeout: self.wait_timeout,
            hold_at_least: self.hold_at_least,
            watchdog: self.watchdog,
            max_hold: self.max_hold,
            name: Some(self.name),
            on_lost: self.on_lost,
        }
    }
}

impl Spec {
    /// The options, checked for calls in `mode` unless they were at
    /// compile time; an error names `key`.
    fn options(self, key: &str, mode: Mode) -> Result<LockOptions, LockError> {
        if !self.checked {
            self.options.validate(key, mode)?;
        }
        Ok(self.options)
    }
}

/// Whether a body's output is its own error (`errors = "into"`): under
/// `on_lost = "notify"` it stands rather than `Lost`.
#[doc(hidden)]
pub fn is_err<T, E>(output: &Result<T, E>) -> bool {
    output.is_err()
}

/// A body's output is never its own error (the plain `LockError` shape).
#[doc(hidden)]
pub fn never_err<T>(_output: &T) -> bool {
    false
}

/// The registry of `registry = expr`: an owned clone, so the expression's
/// borrow ends before the body runs.
#[doc(hidden)]
pub fn registry_of(registry: &LockRegistry) -> LockRegistry {
    registry.clone()
}

/// Wait mode: waits for the lock, runs `body` under it, releases.
/// (Each of these four returns the one future that does the call, with
/// no layer of its own around it: a layer would move the call's future
/// once more.)
#[doc(hidden)]
pub fn run_wait<F: Future>(
    key: &RenderedKey<'_>,
    spec: Spec,
    failed: fn(&F::Output) -> bool,
    body: F,
) -> impl Future<Output = Result<F::Output, LockError>> {
    wait_in(None, key, spec, failed, body)
}

/// [`run_wait`] on the registry of `registry = expr`.
#[doc(hidden)]
pub fn run_wait_in<'a, F: Future>(
    registry: &'a LockRegistry,
    key: &'a RenderedKey<'_>,
    spec: Spec,
    failed: fn(&F::Output) -> bool,
    body: F,
) -> impl Future<Output = Result<F::Output, LockError>> {
    wait_in(Some(registry), key, spec, failed, body)
}

/// Skip mode: one attempt; `Ok(None)` without running `body` when held.
#[doc(hidden)]
pub fn run_skip<F: Future>(
    key: &RenderedKey<'_>,
    spec: Spec,
    failed: fn(&F::Output) -> bool,
    body: F,
) -> impl Future<Output = Result<Option<F::Output>, LockError>> {
    skip_in(None, key, spec, failed, body)
}

/// [`run_skip`] on the registry of `registry = expr`.
#[doc(hidden)]
pub fn run_skip_in<'a, F: Future>(
    registry: &'a LockRegistry,
    key: &'a RenderedKey<'_>,
    spec: Spec,
    failed: fn(&F::Output) -> bool,
    body: F,
) -> impl Future<Output = Result<Option<F::Output>, LockError>> {
    skip_in(Some(registry), key, spec, failed, body)
}

/// Wait mode on `registry`, or on the global one.
async fn wait_in<F: Future>(
    registry: Option<&LockRegistry>,
    key: &RenderedKey<'_>,
    spec: Spec,
    failed: fn(&F::Output) -> bool,
    body: F,
) -> Result<F::Output, LockError> {
    let (registry, key, opts) = prepare(registry, key, spec, Mode::Wait)?;
    let full_key = registry.full_key(key)?;
    let ran = registry
        .run(key, &full_key, &opts, Mode::Wait, failed, body)
        .await?;
    ran.ok_or_else(|| crate::registry::never_skipped(key))
}

/// Skip mode on `registry`, or on the global one.
async fn skip_in<F: Future>(
    registry: Option<&LockRegistry>,
    key: &RenderedKey<'_>,
    spec: Spec,
    failed: fn(&F::Output) -> bool,
    body: F,
) -> Result<Option<F::Output>, LockError> {
    let (registry, key, opts) = prepare(registry, key, spec, Mode::Skip)?;
    let full_key = registry.full_key(key)?;
    registry
        .run(key, &full_key, &opts, Mode::Skip, failed, body)
        .await
}

/// What a one-key call runs on: the registry (`registry`, or the global
/// one), the key, and the options for `mode`. Inlined: a call returning
/// the options by value copies them once more.
#[inline]
fn prepare<'a>(
    registry: Option<&'a LockRegistry>,
    key: &'a RenderedKey<'_>,
    spec: Spec,
    mode: Mode,
) -> Result<(&'a LockRegistry, &'a str, LockOptions), LockError> {
    let registry = registry_or_global(registry)?;
    let key = key.as_str();
    Ok((registry, key, spec.options(key, mode)?))
}

/// `registry`, or the global one.
fn registry_or_global(registry: Option<&LockRegistry>) -> Result<&LockRegistry, LockError> {
    match registry {
        Some(registry) => Ok(registry),
        None => crate::registry(),
    }
}

/// Wait mode with `keys = [..]`: waits for every lock (in canonical order),
/// runs `body` under all of them, releases all. `registry` is the one of
/// `registry = expr`, or the global one.
#[doc(hidden)]
pub async fn run_wait_all<F: Future>(
    registry: Option<&LockRegistry>,
    keys: Vec<RenderedKey<'_>>,
    spec: Spec,
    failed: fn(&F::Output) -> bool,
    body: F,
) -> Result<F::Output, LockError> {
    let first = keys
        .first()
        .map_or_else(String::new, |key| key.as_str().to_owned());
    match run_all(registry, keys, spec, Mode::Wait, failed, body).await? {
        Some(output) => Ok(output),
        None => Err(LockError::Timeout {
            key: LockError::shown_key(&first),
            waited: Duration::ZERO,
        }),
    }
}

/// Skip mode with `keys = [..]`: `Ok(None)` when any of them is held.
#[doc(hidden)]
pub async fn run_skip_all<F: Future>(
    registry: Option<&LockRegistry>,
    keys: Vec<RenderedKey<'_>>,
    spec: Spec,
    failed: fn(&F::Output) -> bool,
    body: F,
) -> Result<Option<F::Output>, LockError> {
    run_all(registry, keys, spec, Mode::Skip, failed, body).await
}

/// Takes the keys this task does not hold yet, runs `body` under every
/// lease (cancelled when any is lost), releases what it took.
async fn run_all<F: Future>(
    registry: Option<&LockRegistry>,
    keys: Vec<RenderedKey<'_>>,
    spec: Spec,
    mode: Mode,
    failed: fn(&F::Output) -> bool,
    body: F,
) -> Result<Option<F::Output>, LockError> {
    let opts = spec.options(keys.first().map_or("", RenderedKey::as_str), mode)?;
    let registry = registry_or_global(registry)?;
    let keys: Vec<String> = keys.iter().map(|key| key.as_str().to_owned()).collect();
    let span = telemetry::locks_span(&keys, mode);
    let result = telemetry::in_span!(span, run_all_in(registry, keys, opts, mode, failed, body));
    let outcome = match &result {
        Ok(Some(_)) => "acquired",
        Ok(None) => "skipped",
        Err(LockError::Timeout { .. }) => "timeout",
        Err(LockError::Lost { .. }) => "lost",
        Err(_) => "error",
    };
    span.record("outcome", outcome);
    result
}

async fn run_all_in<F: Future>(
    registry: &LockRegistry,
    keys: Vec<String>,
    opts: LockOptions,
    mode: Mode,
    failed: fn(&F::Output) -> bool,
    body: F,
) -> Result<Option<F::Output>, LockError> {
    let mut wanted = Vec::new();
    for (key, full_key) in registry.canonical(keys)? {
        // A key this task holds already is re-entered, not taken again.
        match task_locks::held_by_task(registry.id(), &full_key) {
            Some(frame) => section::check_reentry(&key, frame.claim, opts.claim())?,
            None => wanted.push((key, full_key)),
        }
    }
    let guards = if wanted.is_empty() {
        Vec::new()
    } else {
        match registry.acquire_all(&wanted, &opts, mode).await? {
            Some(guards) => guards,
            None => return Ok(None),
        }
    };
    run_guarded(LockGuards::new(guards), opts.on_lost, failed, body)
        .await
        .map(Some)
}

/// [`LockRegistry::run`]'s body and release under several leases: a loss of any counts.
async fn run_guarded<F: Future>(
    guards: LockGuards,
    on_lost: OnLost,
    failed: fn(&F::Output) -> bool,
    body: F,
) -> Result<F::Output, LockError> {
    let output = {
        let mut scope = task_locks::Scope::new(guards.guards().iter().map(section::frame_of));
        let body = pin!(body);
        let lost = pin!(guards.lost());
        section::until_lost(&mut scope, &guards, on_lost, body, lost).await
    };
    match output {
        Some(output) if guards.is_held() => section::settle(output, guards.release().await),
        output => {
            let lost = guards
                .guards()
                .iter()
                .find(|guard| !guard.is_held())
                .map(|guard| guard.key().to_owned())
                .unwrap_or_default();
            let _ = guards.release().await;
            section::lost_under(&lost, output, failed)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::fmt;

    use super::{INLINE_KEY, KeyArg, KeyDisplay, KeyText, Rendered, render_key};

    /// A `Display` that writes `ok` and then fails.
    struct Failing;

    impl fmt::Display for Failing {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("ok")?;
            Err(fmt::Error)
        }
    }

    /// What the attribute emits for a one-placeholder template.
    fn one_placeholder<T: fmt::Display>(value: &T) -> String {
        (&KeyArg(value)).rendered_lock_key().as_str().to_owned()
    }

    #[test]
    #[allow(clippy::needless_borrow, reason = "the form the attribute emits")]
    fn a_one_placeholder_key_borrows_text_and_renders_anything_else() {
        let text = "stock:7";
        let owned = String::from("stock:8");
        let owned_ref = &owned;
        let id = 42u64;
        let by_str = (&KeyArg(&text)).rendered_lock_key();
        assert!(matches!(by_str.0, Rendered::Borrowed("stock:7")));
        let by_string = (&KeyArg(&owned_ref)).rendered_lock_key();
        assert!(matches!(by_string.0, Rendered::Borrowed("stock:8")));
        let by_number = (&KeyArg(&id)).rendered_lock_key();
        assert!(matches!(by_number.0, Rendered::Inline(_)));
        assert_eq!(by_number.as_str(), "42");
        // Through a generic `Display`, text is rendered like anything else.
        assert_eq!(one_placeholder(&text), "stock:7");
        assert_eq!(
            one_placeholder(&"x".repeat(INLINE_KEY + 1)).len(),
            INLINE_KEY + 1
        );
    }

    #[test]
    fn a_key_is_rendered_in_place_when_short_and_on_the_heap_when_not() {
        let fixed = render_key(format_args!("stock:all"));
        assert!(matches!(fixed.0, Rendered::Borrowed("stock:all")));
        let id = 42;
        let short = render_key(format_args!("stock:{id}:ü"));
        assert!(matches!(short.0, Rendered::Inline(_)));
        assert_eq!(short.as_str(), "stock:42:ü");
        let long = "x".repeat(INLINE_KEY);
        let fits = render_key(format_args!("{long}"));
        assert!(matches!(fits.0, Rendered::Inline(_)));
        assert_eq!(fits.as_str(), long);
        let over = render_key(format_args!("{long}{id}"));
        assert!(matches!(over.0, Rendered::Heap(_)));
        assert_eq!(over.as_str(), format!("{long}42"));
        // A failing `Display` keeps what it wrote, without a panic.
        assert_eq!(render_key(format_args!("a:{}", Failing)).as_str(), "a:ok");
    }
}
