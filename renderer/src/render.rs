//! Renders a [`RenderModel`] into HAProxy config text with minijinja. The built-in template is
//! compiled in; operators can replace it. Undefined variables are errors, so a typo in a
//! template fails loudly at start-up instead of rendering an empty directive.

use crate::model::RenderModel;
use minijinja::{Environment, UndefinedBehavior};

/// The template shipped with hafleet.
pub const BUILTIN_TEMPLATE: &str = include_str!("../templates/haproxy.cfg.j2");

const NAME: &str = "haproxy.cfg";

/// A loaded, checked template.
#[derive(Debug)]
pub struct Renderer {
    env: Environment<'static>,
}

#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("template does not compile")]
    Compile(#[source] minijinja::Error),
    #[error("template failed to render")]
    Render(#[source] minijinja::Error),
}

impl Renderer {
    pub fn builtin() -> Self {
        Self::new(BUILTIN_TEMPLATE.to_owned()).expect("the built-in template compiles")
    }

    /// Compiles `source`, and renders it once against an empty fleet so that a template that
    /// cannot render is refused before it is ever used.
    pub fn new(source: String) -> Result<Self, RenderError> {
        let mut env = Environment::new();
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        env.set_keep_trailing_newline(true);
        env.add_template_owned(NAME, source).map_err(RenderError::Compile)?;
        let renderer = Renderer { env };
        renderer.render(&RenderModel {
            fleet: "check".into(),
            rules: vec![],
            backends: vec![],
            notes: vec![],
        })?;
        Ok(renderer)
    }

    pub fn render(&self, model: &RenderModel) -> Result<String, RenderError> {
        let template = self.env.get_template(NAME).map_err(RenderError::Compile)?;
        let mut out = template.render(model).map_err(RenderError::Render)?;
        if !out.ends_with('\n') {
            out.push('\n');
        }
        Ok(out)
    }
}
