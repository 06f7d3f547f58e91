//! The item the attribute is put on: the signature, parsed so its return
//! type can be edited in place, and the body, kept as raw tokens (or taken
//! apart when it has the shape `#[async_trait]` gives it).

use proc_macro2::TokenStream;
use syn::parse::{Parse, ParseStream};
use syn::{Attribute, Expr, Signature, Stmt, Token, Visibility};

/// The function the attribute is put on (tracing's `MaybeItemFn`).
pub(crate) struct LockFn {
    pub(crate) attrs: Vec<Attribute>,
    pub(crate) vis: Visibility,
    pub(crate) sig: Signature,
    pub(crate) inner_attrs: Vec<Attribute>,
    pub(crate) body: Body,
}

/// The statements of the function body.
pub(crate) enum Body {
    /// An `async fn` body, or a non-async body of unknown shape.
    Tokens(TokenStream),
    /// The shape `#[async_trait]` produces: statements, then a final
    /// `Box::pin(async move { .. })`.
    AsyncTrait {
        before: Vec<Stmt>,
        pin: Box<Expr>,
        inner: syn::ExprAsync,
    },
}

impl Parse for LockFn {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let attrs = input.call(Attribute::parse_outer)?;
        let vis: Visibility = input.parse()?;
        let sig: Signature = input.parse()?;
        if input.peek(Token![;]) {
            return Err(syn::Error::new(
                input.span(),
                "`#[distributed_lock]` needs a function body; put it on the implementation, not on the trait's declaration",
            ));
        }
        let content;
        syn::braced!(content in input);
        let inner_attrs = content.call(Attribute::parse_inner)?;
        let body = if sig.asyncness.is_some() {
            Body::Tokens(content.parse()?)
        } else {
            let fork = content.fork();
            match async_trait_shape(&fork) {
                Some(body) => {
                    content.parse::<TokenStream>()?;
                    body
                }
                None => Body::Tokens(content.parse()?),
            }
        };
        Ok(LockFn {
            attrs,
            vis,
            sig,
            inner_attrs,
            body,
        })
    }
}

/// Recognises `stmts; Box::pin(async move { .. })`, as tracing's
/// `AsyncInfo::from_fn` does.
fn async_trait_shape(input: ParseStream<'_>) -> Option<Body> {
    let mut stmts = syn::Block::parse_within(input).ok()?;
    let Some(Stmt::Expr(Expr::Call(call), None)) = stmts.last() else {
        return None;
    };
    let Expr::Path(path) = &*call.func else {
        return None;
    };
    let segments: Vec<String> = path
        .path
        .segments
        .iter()
        .map(|s| s.ident.to_string())
        .collect();
    if !segments.ends_with(&["Box".to_owned(), "pin".to_owned()]) || call.args.len() != 1 {
        return None;
    }
    let Some(Expr::Async(inner)) = call.args.first() else {
        return None;
    };
    let inner = inner.clone();
    let pin = call.func.clone();
    stmts.pop();
    Some(Body::AsyncTrait {
        before: stmts,
        pin,
        inner,
    })
}
