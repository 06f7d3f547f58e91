//! Parse, validate, expand. The expansion is thin: it renders the key and
//! hands the body to one runtime function, which owns everything else.

use proc_macro2::{Ident, Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::visit_mut::VisitMut;
use syn::{ReturnType, Token, Type, parse_quote};

use crate::input::{Body, LockFn};
use crate::parse::{DEFAULT_TTL_MILLIS, DurationArg, LockArgs, Mode};
use crate::valid::{self, Config, validate};

/// Entry point: never panics. On error it emits the error next to the
/// function with the signature a correct attribute would have given it
/// (as tokio's `entry.rs` does), so callers written for the lock's
/// `Result` see no follow-on errors: one mistake, one error.
pub(crate) fn distributed_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    match try_expand(args.clone(), item.clone()) {
        Ok(tokens) => tokens,
        Err(err) => {
            let error = err.into_compile_error();
            let item = fallback(&args, item.clone()).unwrap_or(item);
            quote!(#item #error)
        }
    }
}

/// The function with its rewritten signature and its body run as is, no
/// lock: what the callers expect, for when the attribute is wrong. The
/// mode, `errors` and `crate` are read by the same parser, past the
/// arguments it cannot read; `None` (emit the original item) when the
/// function itself cannot be read.
fn fallback(args: &TokenStream, item: TokenStream) -> Option<TokenStream> {
    let func: LockFn = syn::parse2(item).ok()?;
    let Body::Tokens(stmts) = &func.body else {
        return None;
    };
    func.sig.asyncness?;
    let (attrs, vis, inner_attrs) = (&func.attrs, &func.vis, &func.inner_attrs);
    let mut sig = func.sig.clone();
    let args = syn::parse::Parser::parse2(LockArgs::parse_lenient, args.clone()).ok()?;
    let mode = args.mode();
    let krate = args
        .krate
        .as_ref()
        .map_or_else(|| quote!(::lock_runtime), |path| quote!(#path));
    let declared = output_type(&sig.output);
    let (value_ty, _) = erase_impl_trait(declared.clone());
    let into = args
        .errors_into()
        .then(|| result_parts(&declared).ok())
        .flatten();
    sig.output = locked_return(&sig.output, mode, into.as_ref(), &krate);
    let ret = Ident::new("__lock_ret", Span::mixed_site());
    let run = quote! {
        async move {
            let #ret: #value_ty = { #stmts };
            #[allow(unreachable_code, clippy::needless_return)]
            return #ret;
        }
        .await
    };
    let body = match (&into, mode) {
        (None, Mode::Wait) => quote!(::core::result::Result::Ok(#run)),
        (None, Mode::Skip) => {
            quote!(::core::result::Result::Ok(::core::option::Option::Some(#run)))
        }
        (Some(_), Mode::Wait) => run,
        (Some(_), Mode::Skip) => quote!(#run.map(::core::option::Option::Some)),
    };
    Some(quote! {
        #(#attrs)*
        #vis #sig {
            #(#inner_attrs)*
            #body
        }
    })
}

fn try_expand(args: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    let func: LockFn = syn::parse2(item)?;
    let args: LockArgs = syn::parse2(args)?;
    let config = validate(args, &func)?;
    expand(&config, func)
}

fn expand(config: &Config, func: LockFn) -> syn::Result<TokenStream> {
    let krate = &config.krate;
    let LockFn {
        attrs,
        vis,
        mut sig,
        inner_attrs,
        body,
    } = func;
    let mode = config.mode;
    let key = Ident::new("__lock_key", Span::mixed_site());
    let renders: Vec<TokenStream> = config
        .keys
        .iter()
        .map(|template| template.render(krate))
        .collect();
    let options = options(config);
    let registry = Ident::new("__lock_registry", Span::mixed_site());
    // `run_wait(key, ..)` on the global registry, or `run_wait_in(&registry,
    // key, ..)` on the one `registry = expr` names (cloned first, so the
    // expression's borrow ends before the body runs).
    let (run, in_registry, take_registry) = match (&config.registry, config.multi) {
        (None, false) => (
            match mode {
                Mode::Wait => quote!(run_wait),
                Mode::Skip => quote!(run_skip),
            },
            quote!(),
            quote!(),
        ),
        (Some(expr), false) => (
            match mode {
                Mode::Wait => quote!(run_wait_in),
                Mode::Skip => quote!(run_skip_in),
            },
            quote!(&#registry,),
            quote_spanned! {expr.span()=>
                let #registry = #krate::__private::registry_of(&#expr);
            },
        ),
        (registry_expr, true) => {
            let run = match mode {
                Mode::Wait => quote!(run_wait_all),
                Mode::Skip => quote!(run_skip_all),
            };
            match registry_expr {
                None => (run, quote!(::core::option::Option::None,), quote!()),
                Some(expr) => (
                    run,
                    quote!(::core::option::Option::Some(&#registry),),
                    quote_spanned! {expr.span()=>
                        let #registry = #krate::__private::registry_of(&#expr);
                    },
                ),
            }
        }
    };
    let rendered = if config.multi {
        quote!(::std::vec![#(#renders),*])
    } else {
        quote!(#(#renders)*)
    };
    let render = quote! {
        #take_registry
        let #key = #rendered;
    };
    // One key is lent to the run: it stays in this future, not copied into
    // the run's.
    let key_arg = if config.multi {
        quote!(#key)
    } else {
        quote!(&#key)
    };
    let body = match body {
        Body::Tokens(stmts) => {
            let declared = output_type(&sig.output);
            let (value_ty, erased) = erase_impl_trait(declared.clone());
            let into = if config.errors_into {
                Some(result_parts(&declared)?)
            } else {
                None
            };
            sig.output = locked_return(&sig.output, mode, into.as_ref(), krate);
            let ret = Ident::new("__lock_ret", Span::mixed_site());
            // Pins the async block's output to `R` before the body is checked,
            // so a `return` of the wrong type is reported at the user's value
            // (tracing-attributes' fake return). Not possible for `impl Trait`.
            let pin_output = (!erased).then(|| {
                let span = declared.span().resolved_at(Span::mixed_site());
                let fake = Ident::new("__lock_fake_ret", span);
                quote_spanned! {declared.span()=>
                    #[allow(unreachable_code, clippy::diverging_sub_expression, clippy::empty_loop, clippy::needless_return)]
                    if false {
                        let #fake: #declared = loop {};
                        return #fake;
                    }
                }
            });
            // Input:  async fn f(id: u64) -> R { body }
            // Output: async fn f(id: u64) -> Result<R, LockError> {
            //             let key = render_key(..);
            //             run_wait(&key, options, async move { let ret: R = { body }; ret }).await
            //         }
            let failed = failed(into.is_some(), krate);
            let call = quote! {
                #krate::__private::#run(#in_registry #key_arg, #options, #failed, async move {
                    #pin_output
                    let #ret: #value_ty = { #stmts };
                    #[allow(unreachable_code, clippy::needless_return)]
                    return #ret;
                })
            };
            let done = finish(call, mode, into.as_ref(), krate);
            quote! {
                #render
                #done
            }
        }
        Body::AsyncTrait { before, pin, inner } => {
            let mut rewrite = RewriteOutput {
                mode,
                krate,
                into: config.errors_into,
                parts: None,
                error: None,
            };
            rewrite.visit_return_type_mut(&mut sig.output);
            if let Some(err) = rewrite.error {
                return Err(err);
            }
            let failed = failed(rewrite.parts.is_some(), krate);
            let call =
                quote!(#krate::__private::#run(#in_registry #key_arg, #options, #failed, #inner));
            let done = finish(call, mode, rewrite.parts.as_ref(), krate);
            // Input:  fn f(&self) -> Pin<Box<dyn Future<Output = R> + ..>> { stmts; Box::pin(async move { .. }) }
            // Output: fn f(&self) -> Pin<Box<dyn Future<Output = Result<R, LockError>> + ..>> {
            //             stmts; let key = render_key(..);
            //             Box::pin(async move { run_wait(&key, options, async move { .. }).await })
            //         }
            quote! {
                #(#before)*
                #render
                #pin(async move {
                    #done
                })
            }
        }
    };
    Ok(quote! {
        #(#attrs)*
        #vis #sig {
            #(#inner_attrs)*
            #body
        }
    })
}

/// `T` and `E` of a declared `Result<T, E>`, for `errors = "into"`.
struct ResultParts {
    value: Type,
    error: Type,
}

/// Splits `Result<T, E>` (any path ending in `Result` with two type
/// arguments); an error at the type otherwise.
fn result_parts(ty: &Type) -> syn::Result<ResultParts> {
    let wrong = || {
        syn::Error::new(
            ty.span(),
            "`errors = \"into\"` needs the function to return `Result<T, E>` \
             with `E: From<LockError>`; this one returns another type",
        )
    };
    let Type::Path(path) = ty else {
        return Err(wrong());
    };
    let last = path.path.segments.last().ok_or_else(wrong)?;
    if last.ident != "Result" {
        return Err(wrong());
    }
    let syn::PathArguments::AngleBracketed(args) = &last.arguments else {
        return Err(wrong());
    };
    let types: Vec<&Type> = args
        .args
        .iter()
        .filter_map(|arg| match arg {
            syn::GenericArgument::Type(ty) => Some(ty),
            _ => None,
        })
        .collect();
    match types.as_slice() {
        [value, error] => Ok(ResultParts {
            value: (*value).clone(),
            error: (*error).clone(),
        }),
        _ => Err(wrong()),
    }
}

/// With `errors = "into"`: wait mode keeps `Result<T, E>`, skip mode
/// returns `Result<Option<T>, E>`.
fn into_type(declared: &Type, mode: Mode, parts: &ResultParts) -> Type {
    let ResultParts { value, error } = parts;
    match mode {
        Mode::Wait => declared.clone(),
        Mode::Skip => {
            parse_quote!(::core::result::Result<::core::option::Option<#value>, #error>)
        }
    }
}

/// Awaits the runtime's call; with `errors = "into"`, flattens its result
/// into the body's, the `LockError` converted by `E: From<LockError>` (a
/// missing `From` is reported at `E`).
fn finish(
    call: TokenStream,
    mode: Mode,
    into: Option<&ResultParts>,
    krate: &TokenStream,
) -> TokenStream {
    let Some(ResultParts { error, .. }) = into else {
        return quote!(#call.await);
    };
    let lock_err = Ident::new("__lock_err", Span::mixed_site());
    let value = Ident::new("__lock_value", Span::mixed_site());
    let convert = quote_spanned! {error.span()=>
        <#error as ::core::convert::From<#krate::LockError>>::from(#lock_err)
    };
    let result = quote!(::core::result::Result);
    let option = quote!(::core::option::Option);
    match mode {
        Mode::Wait => quote! {
            match #call.await {
                #result::Ok(#value) => #value,
                #result::Err(#lock_err) => #result::Err(#convert),
            }
        },
        Mode::Skip => quote! {
            match #call.await {
                #result::Ok(#option::Some(#result::Ok(#value))) => #result::Ok(#option::Some(#value)),
                #result::Ok(#option::Some(#result::Err(#lock_err))) => #result::Err(#lock_err),
                #result::Ok(#option::None) => #result::Ok(#option::None),
                #result::Err(#lock_err) => #result::Err(#convert),
            }
        },
    }
}

/// Builds the call site's spec from `__private::Args { ttl, .. }`: a
/// literal duration becomes `Duration::from_millis(N)`, an expression is
/// used as it is, typed `Duration` at its own span (so a wrong type is
/// reported there).
//
// Input:  ttl = "10s", mode = "skip"
// Output: { const __LOCK_SPEC: Spec = Args { ttl: Duration::from_millis(10000), .. }.checked(true); __LOCK_SPEC }
//
// With any expression among the options, `Args { .. }.unchecked()`: the
// runtime checks it when the call runs.
fn options(config: &Config) -> TokenStream {
    let krate = &config.krate;
    let duration = |value: &DurationArg| match value {
        DurationArg::Literal(millis) => {
            let n = millis.millis;
            quote!(::core::time::Duration::from_millis(#n))
        }
        DurationArg::Expr(expr) => {
            quote_spanned! {expr.span()=> {
                let __lock_duration: ::core::time::Duration = #expr;
                __lock_duration
            }}
        }
    };
    let optional = |value: &Option<DurationArg>| match value {
        Some(value) => {
            let value = duration(value);
            quote!(::core::option::Option::Some(#value))
        }
        None => quote!(::core::option::Option::None),
    };
    let ttl = match &config.ttl {
        Some(ttl) => duration(ttl),
        None => quote!(::core::time::Duration::from_millis(#DEFAULT_TTL_MILLIS)),
    };
    let watchdog = config.watchdog;
    let wait_timeout = optional(&config.wait_timeout);
    let hold_at_least = optional(&config.hold_at_least);
    let max_hold = optional(&config.max_hold);
    let name = &config.name;
    let on_lost = if config.notify_on_lost {
        quote!(#krate::OnLost::Notify)
    } else {
        quote!(#krate::OnLost::Cancel)
    };
    let permits = match &config.permits {
        Some(expr) => quote_spanned! {expr.span()=> {
            let __lock_permits: u32 = #expr;
            __lock_permits
        }},
        None => quote!(1u32),
    };
    let access = if config.read {
        quote!(#krate::Access::Read)
    } else {
        quote!(#krate::Access::Write)
    };
    let fencing = config.fencing;
    let args = quote! {
        #krate::__private::Args {
            ttl: #ttl,
            wait_timeout: #wait_timeout,
            hold_at_least: #hold_at_least,
            watchdog: #watchdog,
            max_hold: #max_hold,
            name: #name,
            on_lost: #on_lost,
            permits: #permits,
            access: #access,
            fencing: #fencing,
        }
    };
    if valid::all_literal(config) {
        let single_attempt = config.mode == Mode::Skip;
        quote! {{
            const __LOCK_SPEC: #krate::__private::Spec = #args.checked(#single_attempt);
            __LOCK_SPEC
        }}
    } else {
        quote!(#args.unchecked())
    }
}

/// The runtime's test of whether the body's output is its own error:
/// `__private::is_err` with `errors = "into"`, else `__private::never_err`.
fn failed(into: bool, krate: &TokenStream) -> TokenStream {
    if into {
        quote!(#krate::__private::is_err)
    } else {
        quote!(#krate::__private::never_err)
    }
}

/// The declared value type: `T` for `-> T`, `()` for no return type.
fn output_type(output: &ReturnType) -> Type {
    match output {
        ReturnType::Default => parse_quote!(()),
        ReturnType::Type(_, ty) => (**ty).clone(),
    }
}

/// `T` -> `Result<T, LockError>` (wait) or `Result<Option<T>, LockError>` (skip).
fn wrap_type(ty: &Type, mode: Mode, krate: &TokenStream) -> Type {
    match mode {
        Mode::Wait => parse_quote!(::core::result::Result<#ty, #krate::LockError>),
        Mode::Skip => parse_quote!(
            ::core::result::Result<::core::option::Option<#ty>, #krate::LockError>
        ),
    }
}

/// The locked function's output type: `T` wrapped by [`wrap_type`], or with
/// `errors = "into"` (`into`) the body's `Result` by [`into_type`].
fn locked_type(ty: &Type, mode: Mode, into: Option<&ResultParts>, krate: &TokenStream) -> Type {
    match into {
        None => wrap_type(ty, mode, krate),
        Some(parts) => into_type(ty, mode, parts),
    }
}

fn locked_return(
    output: &ReturnType,
    mode: Mode,
    into: Option<&ResultParts>,
    krate: &TokenStream,
) -> ReturnType {
    let arrow = match output {
        ReturnType::Default => <Token![->]>::default(),
        ReturnType::Type(arrow, _) => *arrow,
    };
    ReturnType::Type(
        arrow,
        Box::new(locked_type(&output_type(output), mode, into, krate)),
    )
}

/// Replaces every `impl Trait` with `_`, so the body's type can be pinned
/// (async-trait's `replace_impl_trait_with_infer`); says whether it did.
fn erase_impl_trait(mut ty: Type) -> (Type, bool) {
    struct Erase(bool);
    impl VisitMut for Erase {
        fn visit_type_mut(&mut self, ty: &mut Type) {
            if let Type::ImplTrait(_) = ty {
                *ty = parse_quote!(_);
                self.0 = true;
            } else {
                syn::visit_mut::visit_type_mut(self, ty);
            }
        }
    }
    let mut erase = Erase(false);
    erase.visit_type_mut(&mut ty);
    (ty, erase.0)
}

/// Rewrites `Output = T` inside an async-trait return type (with
/// `errors = "into"`, keeps `T`'s parts for the expansion).
struct RewriteOutput<'a> {
    mode: Mode,
    krate: &'a TokenStream,
    into: bool,
    parts: Option<ResultParts>,
    error: Option<syn::Error>,
}

impl VisitMut for RewriteOutput<'_> {
    fn visit_assoc_type_mut(&mut self, assoc: &mut syn::AssocType) {
        if assoc.ident == "Output" {
            let parts = if self.into {
                match result_parts(&assoc.ty) {
                    Ok(parts) => Some(parts),
                    Err(err) => {
                        self.error = Some(err);
                        return;
                    }
                }
            } else {
                None
            };
            assoc.ty = locked_type(&assoc.ty, self.mode, parts.as_ref(), self.krate);
            self.parts = parts;
        } else {
            syn::visit_mut::visit_assoc_type_mut(self, assoc);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expand_str(args: &str, item: &str) -> String {
        distributed_lock(args.parse().unwrap(), item.parse().unwrap()).to_string()
    }

    #[test]
    fn wait_mode_wraps_the_return_type_and_calls_run_wait() {
        let out = expand_str(
            r#"key = "stock:{item_id}", ttl = "10s""#,
            "async fn buy(item_id: u64, qty: u32) -> u32 { qty }",
        );
        assert!(
            out.contains(":: core :: result :: Result < u32 , :: lock_runtime :: LockError >"),
            "{out}"
        );
        assert!(out.contains("run_wait"), "{out}");
        assert!(out.contains("10000u64"), "{out}");
        assert!(!out.contains("compile_error"), "{out}");
    }

    #[test]
    fn skip_mode_wraps_in_option() {
        let out = expand_str(r#"key = "job", mode = "skip""#, "async fn job() {}");
        assert!(out.contains("Option < ()"), "{out}");
        assert!(out.contains("run_skip"), "{out}");
    }

    #[test]
    fn crate_path_replaces_the_default_root() {
        let out = expand_str(r#"key = "job", crate = "my::locks""#, "async fn job() {}");
        assert!(
            out.contains("my :: locks :: __private :: run_wait"),
            "{out}"
        );
        assert!(!out.contains("lock_runtime"), "{out}");
    }

    #[test]
    fn errors_keep_the_rewritten_signature_and_the_body() {
        let out = expand_str(r#"key = "job", tll = "1s""#, "async fn job() -> u8 { 7 }");
        assert!(
            out.starts_with(
                "async fn job () -> :: core :: result :: Result < u8 , :: lock_runtime :: LockError >"
            ),
            "{out}"
        );
        assert!(out.contains("{ 7 }"), "{out}");
        assert!(!out.contains("run_wait"), "{out}");
        assert!(out.contains("compile_error"), "{out}");
        let skip = expand_str(
            r#"key = "job", mode = "skip", tll = "1s""#,
            "async fn job() {}",
        );
        assert!(skip.contains("Option < ()"), "{skip}");
        // The arguments after one the parser cannot read still count.
        let past = expand_str(
            r#"key = "job", ttl = 5, mode = "skip", crate = "my::locks""#,
            "async fn job() {}",
        );
        assert!(past.contains("Option < ()"), "{past}");
        assert!(past.contains("my :: locks :: LockError"), "{past}");
        assert_eq!(past.matches("compile_error").count(), 1, "{past}");
        // A function that cannot be read is emitted as it was.
        let not_async = expand_str(r#"key = "job""#, "fn job() {}");
        assert!(not_async.starts_with("fn job () { }"), "{not_async}");
    }

    #[test]
    fn async_trait_shape_rewrites_the_future_output() {
        let out = expand_str(
            r#"key = "k:{self.id}""#,
            "fn f<'a>(&'a self) -> ::core::pin::Pin<Box<dyn ::core::future::Future<Output = u8> + Send + 'a>> {
                 Box::pin(async move { let __ret: u8 = { 1 }; __ret })
             }",
        );
        assert!(
            out.contains("Output = :: core :: result :: Result < u8"),
            "{out}"
        );
        assert!(
            out.contains("Box :: pin (async move { :: lock_runtime :: __private :: run_wait"),
            "{out}"
        );
    }
}
