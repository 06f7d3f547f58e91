//! The attribute's scheduled-job form: `#[distributed_lock(job = "name",
//! every = "1h")]` (or `cron = ".."`) on an `async fn` that takes nothing or the fire, which
//! becomes a function that starts the job on this replica
//! (`lock_runtime::job::Job::spawn`) and returns its handle.

use proc_macro2::{Span, TokenStream, TokenTree};
use quote::{format_ident, quote};
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::spanned::Spanned;
use syn::{FnArg, Ident, LitStr, Token};

use crate::errors::Errors;
use crate::input::{Body, LockFn};
use crate::parse::{self, DurationArg};

/// The arguments of the job form, in the order the error message lists
/// them.
const JOB_ARGUMENTS: &[&str] = &[
    "job", "every", "cron", "overlap", "ttl", "max_skew", "registry", "crate",
];

/// Whether `args` is the job form: one of its arguments is `job = ..`.
pub(crate) fn is_job(args: &TokenStream) -> bool {
    let trees: Vec<TokenTree> = args.clone().into_iter().collect();
    trees.windows(2).enumerate().any(|(i, pair)| {
        let starts_argument =
            i == 0 || matches!(&trees[i - 1], TokenTree::Punct(p) if p.as_char() == ',');
        starts_argument
            && matches!(&pair[0], TokenTree::Ident(ident) if ident == "job")
            && matches!(&pair[1], TokenTree::Punct(p) if p.as_char() == '=')
    })
}

/// What a fire does while another run of the job goes on.
#[derive(Clone, Copy)]
enum Overlap {
    Allow,
    Skip,
    Wait,
}

/// The parsed arguments of the job form.
#[derive(Default)]
struct JobArgs {
    job: Option<LitStr>,
    every: Option<DurationArg>,
    cron: Option<LitStr>,
    overlap: Option<Overlap>,
    ttl: Option<DurationArg>,
    max_skew: Option<DurationArg>,
    registry: Option<syn::Expr>,
    krate: Option<syn::Path>,
}

impl Parse for JobArgs {
    /// Every value error at once; the first syntax error alone.
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let mut args = JobArgs::default();
        let mut errors = Errors::default();
        while !input.is_empty() {
            let ident = input.call(Ident::parse_any)?;
            let span = ident.span();
            let name = ident.to_string();
            let value = match name.as_str() {
                "job" => parse::parse_value::<LitStr>(input).map(|lit| {
                    if lit.value().is_empty() {
                        Err(syn::Error::new(
                            lit.span(),
                            "a job's name must not be empty; it names its locks, e.g. `job = \"nightly-report\"`",
                        ))
                    } else {
                        parse::set_once(&mut args.job, lit, span, "job")
                    }
                })?,
                "every" => parse::duration_arg(input, &mut args.every, span, "every")?,
                "cron" => {
                    let lit = parse::parse_value::<LitStr>(input)?;
                    parse::set_once(&mut args.cron, lit, span, "cron")
                }
                "ttl" => parse::duration_arg(input, &mut args.ttl, span, "ttl")?,
                "max_skew" => parse::duration_arg(input, &mut args.max_skew, span, "max_skew")?,
                "overlap" => {
                    let lit = parse::parse_value::<LitStr>(input)?;
                    let overlap = match lit.value().as_str() {
                        "allow" => Ok(Overlap::Allow),
                        "skip" => Ok(Overlap::Skip),
                        "wait" => Ok(Overlap::Wait),
                        other => Err(syn::Error::new(
                            lit.span(),
                            format!(
                                "unknown overlap {other:?}; expected \"allow\", \"skip\" or \"wait\""
                            ),
                        )),
                    };
                    overlap.and_then(|o| parse::set_once(&mut args.overlap, o, span, "overlap"))
                }
                "registry" => {
                    let expr = parse::parse_value::<syn::Expr>(input)?;
                    parse::set_once(&mut args.registry, expr, span, "registry")
                }
                "crate" => {
                    let lit = parse::parse_value::<LitStr>(input)?;
                    parse::crate_path(&lit)
                        .and_then(|path| parse::set_once(&mut args.krate, path, span, "crate"))
                }
                other => {
                    let expected = JOB_ARGUMENTS
                        .iter()
                        .map(|name| format!("`{name}`"))
                        .collect::<Vec<_>>()
                        .join(", ");
                    let why = if parse::ARGUMENTS.contains(&other) {
                        format!(
                            "`{other}` is not an argument of a scheduled job (`job = ..`): each fire is a lock of its own, named by the job and the fire's instant; expected one of {expected}"
                        )
                    } else {
                        format!("unknown argument `{other}`; expected one of {expected}")
                    };
                    return Err(syn::Error::new(span, why));
                }
            };
            errors.take(value);
            if !input.is_empty() {
                input.parse::<Token![,]>()?;
            }
        }
        if let Some(every) = args
            .every
            .as_ref()
            .filter(|every| every.millis() == Some(0))
        {
            errors.push(syn::Error::new(
                every.span(),
                "a job's period must be at least 1 ms, e.g. `every = \"1h\"`",
            ));
        }
        errors.or(args)
    }
}

/// The job form's expansion, or its error beside a function of the
/// signature a correct attribute gives (so callers see one error).
pub(crate) fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    match try_expand(args, item.clone()) {
        Ok(tokens) => tokens,
        Err(err) => {
            let error = err.into_compile_error();
            match syn::parse2::<LockFn>(item.clone()) {
                Ok(func) => {
                    let (attrs, vis, ident) = (&func.attrs, &func.vis, &func.sig.ident);
                    quote! {
                        #(#attrs)*
                        #vis fn #ident() -> ::core::result::Result<::lock_runtime::job::JobHandle, ::lock_runtime::LockError> {
                            ::core::unreachable!()
                        }
                        #error
                    }
                }
                Err(_) => quote!(#item #error),
            }
        }
    }
}

fn try_expand(args: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    let func: LockFn = syn::parse2(item)?;
    let args: JobArgs = syn::parse2(args)?;
    let mut errors = Errors::default();
    let Some(name) = &args.job else {
        unreachable!("the job form has a `job` argument")
    };
    let krate = args
        .krate
        .as_ref()
        .map_or_else(|| quote!(::lock_runtime), |path| quote!(#path));
    let duration = |arg: &DurationArg| match arg {
        DurationArg::Literal(millis) => {
            let ms = millis.millis;
            quote!(::core::time::Duration::from_millis(#ms))
        }
        DurationArg::Expr(expr) => quote!(#expr),
    };
    let schedule = match (&args.every, &args.cron) {
        (Some(every), None) => {
            let every = duration(every);
            Some(quote!(#krate::job::Schedule::every(#every)))
        }
        (None, Some(cron)) => Some(quote!(#krate::job::Schedule::cron(#cron))),
        (Some(_), Some(cron)) => {
            errors.push(syn::Error::new(
                cron.span(),
                "a job has one schedule: `every = ..` or `cron = ..`, not both",
            ));
            None
        }
        (None, None) => {
            errors.push(syn::Error::new(
                Span::call_site(),
                "a scheduled job needs its schedule, e.g. `every = \"1h\"` or `cron = \"0 3 * * *\"`",
            ));
            None
        }
    };
    let fire = errors.take(check_function(&func)).flatten();
    let schedule = errors.or(schedule)?.expect("checked above");
    let mut settings = Vec::new();
    if let Some(overlap) = args.overlap {
        let variant = match overlap {
            Overlap::Allow => quote!(Allow),
            Overlap::Skip => quote!(Skip),
            Overlap::Wait => quote!(Wait),
        };
        settings.push(quote!(.overlap(#krate::job::Overlap::#variant)));
    }
    if let Some(ttl) = &args.ttl {
        let ttl = duration(ttl);
        settings.push(quote!(.ttl(#ttl)));
    }
    if let Some(skew) = &args.max_skew {
        let skew = duration(skew);
        settings.push(quote!(.max_skew(#skew)));
    }
    let registry = Ident::new("__job_registry", Span::mixed_site());
    let take_registry = match &args.registry {
        Some(expr) => quote!(let #registry = #krate::__private::registry_of(&#expr);),
        None => quote!(let #registry = #krate::registry()?.clone();),
    };
    let LockFn {
        attrs,
        vis,
        sig,
        inner_attrs,
        body,
    } = func;
    let Body::Tokens(stmts) = body else {
        unreachable!("an async fn's body is kept as tokens")
    };
    let body_fn = format_ident!("__job_body_{}", sig.ident, span = Span::mixed_site());
    let (inputs, output) = (&sig.inputs, &sig.output);
    let outer_ident = &sig.ident;
    let argument = Ident::new("__job_fire", Span::mixed_site());
    let call = if fire.is_some() {
        quote!(#body_fn(#argument))
    } else {
        quote!({
            let _ = #argument;
            #body_fn()
        })
    };
    Ok(quote! {
        #(#attrs)*
        #vis fn #outer_ident() -> ::core::result::Result<#krate::job::JobHandle, #krate::LockError> {
            async fn #body_fn(#inputs) #output {
                #(#inner_attrs)*
                #stmts
            }
            #take_registry
            #krate::job::Job::new(#name, #schedule)
                #(#settings)*
                .spawn(&#registry, move |#argument: #krate::job::Fire| #call)
        }
    })
}

/// Checks the function a job runs: an `async fn` without generics or a
/// receiver, taking nothing or the fire (`lock_runtime::job::Fire`);
/// `Some` of the fire's argument when it takes it.
fn check_function(func: &LockFn) -> syn::Result<Option<Span>> {
    let sig = &func.sig;
    if sig.asyncness.is_none() {
        return Err(syn::Error::new(
            sig.fn_token.span,
            "a scheduled job (`job = ..`) runs an `async fn`",
        ));
    }
    if !sig.generics.params.is_empty() {
        return Err(syn::Error::new(
            sig.generics.span(),
            "a scheduled job's function cannot be generic: every fire calls the same function",
        ));
    }
    let mut inputs = sig.inputs.iter();
    let fire = match inputs.next() {
        None => None,
        Some(FnArg::Receiver(receiver)) => {
            return Err(syn::Error::new(
                receiver.span(),
                "a scheduled job's function takes no `self`: put it on a free function, which reaches what it needs through statics or `registry = ..`",
            ));
        }
        Some(FnArg::Typed(typed)) => Some(typed.span()),
    };
    if let Some(extra) = inputs.next() {
        return Err(syn::Error::new(
            extra.span(),
            "a scheduled job's function takes nothing, or one argument: the fire (`lock_runtime::job::Fire`)",
        ));
    }
    Ok(fire)
}
