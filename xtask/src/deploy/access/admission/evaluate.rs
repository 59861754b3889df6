//! A ValidatingAdmissionPolicy evaluated with the `cel` crate as the API server would: match
//! conditions, variables in order (lazily: one that fails stays unset), then validations, with
//! `failurePolicy: Fail`.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{Value, json};

use super::super::NODE_NAME_KEY;
use super::requests::Request;

/// What the policy says about a request.
#[derive(Debug, PartialEq)]
pub(super) enum Verdict {
    /// A match condition is false: the policy does not apply.
    NotMatched,
    Allowed,
    Denied(String),
}

fn to_cel(v: &Value) -> cel::Value {
    cel::to_value(v).unwrap_or(cel::Value::Null)
}

/// Evaluates the policy `spec` (match conditions, variables, validations) on `request` as the
/// API server would, with `failurePolicy: Fail`: an expression that fails to evaluate denies.
/// Err: an expression does not compile.
pub(super) fn evaluate(spec: &Value, request: &Request) -> Result<Verdict, String> {
    let env = Arc::new(cel::Env::stdlib());
    let req = request_attributes(request);
    // Everything compiles, whether or not this request reaches it.
    let policy = CompiledPolicy::compile(&env, spec)?;
    let mut ctx = cel::Context::with_env(env.clone());
    ctx.add_variable_from_value("request", to_cel(&req));
    ctx.add_variable_from_value("object", to_cel(&request.object));
    ctx.add_variable_from_value("oldObject", to_cel(&request.old));
    ctx.add_variable_from_value("variables", HashMap::<String, cel::Value>::new());
    Ok(policy.judge(&mut ctx))
}

/// The admission request the policy sees as `request`: kind and resource, the slice's name,
/// the operation, and the user with its groups and, for a pod-bound token, its node and pod.
fn request_attributes(request: &Request) -> Value {
    let mut extra = serde_json::Map::new();
    if let Some(n) = request.node {
        extra.insert(NODE_NAME_KEY.into(), json!([n]));
        extra.insert(
            "authentication.kubernetes.io/pod-name".into(),
            json!(["kubedev-x7k2p"]),
        );
    }
    let namespace = request
        .user
        .strip_prefix("system:serviceaccount:")
        .and_then(|r| r.split(':').next())
        .unwrap_or_default();
    json!({
        "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceSlice"},
        "resource": {"group": "resource.k8s.io", "version": "v1", "resource": "resourceslices"},
        "name": (if request.object.is_null() { &request.old } else { &request.object })
            .pointer("/metadata/name"),
        "operation": request.operation,
        "userInfo": {
            "username": request.user,
            "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{namespace}"),
                       "system:authenticated"],
            "extra": extra,
        },
        "dryRun": false,
    })
}

/// A policy's expressions, compiled.
struct CompiledPolicy {
    /// Match conditions, with their text.
    conditions: Vec<(cel::Program, String)>,
    /// Variables by name, in order.
    variables: Vec<(String, cel::Program)>,
    /// Validations, with their text and the message a failure gives.
    validations: Vec<(cel::Program, String, String)>,
}

impl CompiledPolicy {
    /// Compiles every expression of the policy `spec` (message expressions too, though they
    /// are not evaluated); Err names the first that does not compile.
    fn compile(env: &cel::Env, spec: &Value) -> Result<CompiledPolicy, String> {
        let compile = |e: &str| {
            env.compile(e)
                .map_err(|err| format!("expression {e:?} does not compile: {err}"))
        };
        let list = |k: &str| -> Vec<&Value> {
            spec.get(k)
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .collect()
        };
        let text = |v: &Value, k: &str| {
            v.get(k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let mut conditions = Vec::new();
        for c in list("matchConditions") {
            let expr = text(c, "expression");
            conditions.push((compile(&expr)?, expr));
        }
        let mut variables = Vec::new();
        for v in list("variables") {
            variables.push((text(v, "name"), compile(&text(v, "expression"))?));
        }
        let mut validations = Vec::new();
        for v in list("validations") {
            if let Some(m) = v.get("messageExpression").and_then(Value::as_str) {
                compile(m)?;
            }
            let expr = text(v, "expression");
            let message = v
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or(&expr)
                .trim()
                .to_string();
            validations.push((compile(&expr)?, expr, message));
        }
        Ok(CompiledPolicy {
            conditions,
            variables,
            validations,
        })
    }

    /// The verdict on the request whose `request`, `object` and `oldObject` `ctx` holds.
    fn judge(&self, ctx: &mut cel::Context<'_, '_>) -> Verdict {
        for (program, expr) in &self.conditions {
            match program.execute(ctx) {
                Ok(cel::Value::Bool(true)) => {}
                Ok(cel::Value::Bool(false)) => return Verdict::NotMatched,
                other => {
                    return Verdict::Denied(format!("match condition {expr:?} gives {other:?}"));
                }
            }
        }
        // Variables in order, each seeing the ones before; one that fails stays unset, so an
        // expression that reads it fails too (as the API server's lazy variables do).
        let mut variables: HashMap<String, cel::Value> = HashMap::new();
        for (name, program) in &self.variables {
            if let Ok(value) = program.execute(ctx) {
                variables.insert(name.clone(), value);
                ctx.add_variable_from_value("variables", variables.clone());
            }
        }
        for (program, expr, message) in &self.validations {
            match program.execute(ctx) {
                Ok(cel::Value::Bool(true)) => {}
                Ok(cel::Value::Bool(false)) => return Verdict::Denied(message.clone()),
                other => return Verdict::Denied(format!("{expr:?} gives {other:?}")),
            }
        }
        Verdict::Allowed
    }
}
