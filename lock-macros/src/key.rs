//! Key templates: `"order:{id}"` -> `[Lit("order:"), Param(id)]`.
//!
//! `{name}` names a parameter, `{name.field.0}` a field path below it and
//! `{self.field}` a field of the receiver. `{{` and `}}` are literal braces.

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote, quote_spanned};
use syn::{Ident, LitStr};

/// One piece of a key template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Part {
    /// Literal text, with `{{`/`}}` already unescaped.
    Lit(String),
    /// A placeholder: the root (`self` or a parameter) and its field path.
    Param { root: String, fields: Vec<String> },
}

/// A parsed key template and the literal it came from.
#[derive(Clone)]
pub(crate) struct KeyTemplate {
    pub(crate) parts: Vec<Part>,
    pub(crate) lit: LitStr,
}

impl KeyTemplate {
    /// Scans the template, reporting the first malformed placeholder.
    pub(crate) fn parse(lit: &LitStr) -> syn::Result<Self> {
        let parts = scan(&lit.value()).map_err(|msg| syn::Error::new(lit.span(), msg))?;
        Ok(KeyTemplate {
            parts,
            lit: lit.clone(),
        })
    }

    /// The roots the placeholders refer to, in order of appearance.
    pub(crate) fn roots(&self) -> impl Iterator<Item = &str> {
        self.parts.iter().filter_map(|part| match part {
            Part::Param { root, .. } => Some(root.as_str()),
            Part::Lit(_) => None,
        })
    }

    /// The expression that renders this key for one call: the value of a
    /// template that is one placeholder through `KeyArg` (borrowed when it
    /// is text), else `render_key(format_args!(..))`.
    pub(crate) fn render(&self, krate: &TokenStream) -> TokenStream {
        match self.parts.as_slice() {
            [Part::Param { root, fields }] => {
                let span = self.lit.span();
                let value = placeholder_expr(root, fields, span);
                quote_spanned!(span=> {
                    #[allow(unused_imports)]
                    use #krate::__private::{KeyDisplay as _, KeyText as _};
                    (&#krate::__private::KeyArg(&#value)).rendered_lock_key()
                })
            }
            _ => {
                let format_args = self.format_args();
                quote!(#krate::__private::render_key(#format_args))
            }
        }
    }

    /// Builds `::core::format_args!("order:{}", id)`.
    ///
    /// Parameter idents carry the key literal's span so they resolve to the
    /// function's parameters (the call site), as thiserror's `fmt.rs` does.
    pub(crate) fn format_args(&self) -> TokenStream {
        let span = self.lit.span();
        let mut fmt = String::new();
        let mut args = Vec::new();
        for part in &self.parts {
            match part {
                Part::Lit(text) => fmt.push_str(&text.replace('{', "{{").replace('}', "}}")),
                Part::Param { root, fields } => {
                    fmt.push_str("{}");
                    args.push(placeholder_expr(root, fields, span));
                }
            }
        }
        let fmt = LitStr::new(&fmt, span);
        quote!(::core::format_args!(#fmt #(, #args)*))
    }
}

/// Input: `self`, `["order", "id"]`. Output: `self.order.id`.
fn placeholder_expr(root: &str, fields: &[String], span: Span) -> TokenStream {
    let mut expr = if root == "self" {
        syn::Token![self](span).into_token_stream()
    } else {
        Ident::new(root, span).into_token_stream()
    };
    for field in fields {
        let member = match field.parse::<u32>() {
            Ok(index) => syn::Member::Unnamed(syn::Index { index, span }),
            Err(_) => syn::Member::Named(Ident::new(field, span)),
        };
        expr = quote!(#expr.#member);
    }
    expr
}

/// Splits template text into parts; the error is the message to show.
fn scan(text: &str) -> Result<Vec<Part>, String> {
    let mut parts = Vec::new();
    let mut lit = String::new();
    let mut chars = text.char_indices().peekable();
    while let Some((at, ch)) = chars.next() {
        match ch {
            '{' if chars.peek().map(|&(_, c)| c) == Some('{') => {
                chars.next();
                lit.push('{');
            }
            '}' if chars.peek().map(|&(_, c)| c) == Some('}') => {
                chars.next();
                lit.push('}');
            }
            '}' => {
                return Err(format!(
                    "unmatched `}}` at byte {at} of key template; write `}}}}` for a literal brace"
                ));
            }
            '{' => {
                let start = at + 1;
                let end = loop {
                    match chars.next() {
                        Some((end, '}')) => break end,
                        Some((_, '{')) | None => {
                            return Err(format!(
                                "unclosed `{{` at byte {at} of key template; write `{{{{` for a literal brace"
                            ));
                        }
                        Some(_) => {}
                    }
                };
                if !lit.is_empty() {
                    parts.push(Part::Lit(std::mem::take(&mut lit)));
                }
                parts.push(placeholder(&text[start..end])?);
            }
            other => lit.push(other),
        }
    }
    if !lit.is_empty() {
        parts.push(Part::Lit(lit));
    }
    if parts.is_empty() {
        return Err("key template is empty; a lock needs a key such as \"job:report\"".into());
    }
    Ok(parts)
}

/// Parses the inside of `{...}`: `root(.field)*`.
fn placeholder(inner: &str) -> Result<Part, String> {
    if inner.is_empty() {
        return Err("empty placeholder `{}` in key template; name a parameter, e.g. `{id}`".into());
    }
    if let Some((name, _)) = inner.split_once(':') {
        return Err(format!(
            "format spec in placeholder `{{{inner}}}` is not supported; write `{{{name}}}`, keys use `Display`"
        ));
    }
    let mut segments = inner.split('.');
    let root = segments.next().unwrap_or_default();
    if !is_ident(root) {
        return Err(format!(
            "placeholder `{{{inner}}}` must start with a parameter name or `self`"
        ));
    }
    let fields = segments
        .map(|field| {
            if is_ident(field) || field.parse::<u32>().is_ok_and(|n| n.to_string() == field) {
                Ok(field.to_owned())
            } else {
                Err(format!(
                    "invalid field `{field}` in placeholder `{{{inner}}}`; expected a field name or index"
                ))
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Part::Param {
        root: root.to_owned(),
        fields,
    })
}

fn is_ident(text: &str) -> bool {
    let mut chars = text.chars();
    let first_ok = chars.next().is_some_and(|c| c == '_' || c.is_alphabetic());
    first_ok && text != "_" && chars.all(|c| c == '_' || c.is_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(text: &str) -> Vec<Part> {
        scan(text).unwrap()
    }

    fn lit(text: &str) -> Part {
        Part::Lit(text.into())
    }

    fn param(root: &str, fields: &[&str]) -> Part {
        Part::Param {
            root: root.into(),
            fields: fields.iter().map(|f| f.to_string()).collect(),
        }
    }

    #[test]
    fn literal_and_parameters() {
        assert_eq!(
            parts("stock:{item_id}:{qty}"),
            vec![
                lit("stock:"),
                param("item_id", &[]),
                lit(":"),
                param("qty", &[])
            ]
        );
        assert_eq!(parts("job:nightly"), vec![lit("job:nightly")]);
        assert_eq!(parts("{id}"), vec![param("id", &[])]);
    }

    #[test]
    fn field_paths_and_self() {
        assert_eq!(
            parts("o:{order.customer.id}:{self.shard}:{pair.0}"),
            vec![
                lit("o:"),
                param("order", &["customer", "id"]),
                lit(":"),
                param("self", &["shard"]),
                lit(":"),
                param("pair", &["0"]),
            ]
        );
    }

    #[test]
    fn escaped_braces_are_literal() {
        assert_eq!(parts("{{tag}}:{id}"), vec![lit("{tag}:"), param("id", &[])]);
        assert_eq!(parts("}}{{"), vec![lit("}{")]);
    }

    #[test]
    fn malformed_templates_are_rejected() {
        assert!(scan("a:{id").unwrap_err().starts_with("unclosed `{`"));
        assert!(scan("a:id}").unwrap_err().starts_with("unmatched `}`"));
        assert!(scan("a:{{id}").unwrap_err().starts_with("unmatched `}`"));
        assert!(scan("a:{}").unwrap_err().starts_with("empty placeholder"));
        assert!(scan("a:{id:?}").unwrap_err().starts_with("format spec"));
        assert!(
            scan("a:{1x}")
                .unwrap_err()
                .contains("must start with a parameter")
        );
        assert!(scan("a:{a.}").unwrap_err().contains("invalid field ``"));
        assert!(
            scan("a:{a.b c}")
                .unwrap_err()
                .contains("invalid field `b c`")
        );
        assert!(scan("a:{a{b}").unwrap_err().starts_with("unclosed `{`"));
        assert!(scan("").unwrap_err().starts_with("key template is empty"));
    }

    #[test]
    fn format_args_escape_literal_braces() {
        let template = KeyTemplate::parse(&syn::parse_quote!("{{x}}:{id.0}")).unwrap();
        let tokens = template.format_args().to_string();
        assert!(tokens.contains(r#""{{x}}:{}""#), "{tokens}");
        assert!(tokens.contains("id . 0"), "{tokens}");
    }
}
