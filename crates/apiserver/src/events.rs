//! Kubernetes Events about this node, for what an operator must see in `kubectl describe node`
//! (and `kubectl get events`) rather than only in the daemon's log.

use k8s_openapi::api::core::v1::{Node, ObjectReference};
use kube::Client;
use kube::api::Api;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

use crate::error::Error;

/// The longest note the API server accepts in an Event, in bytes.
pub const MAX_EVENT_NOTE: usize = 1024;

/// Records Events (`events.k8s.io/v1`) regarding this node's Node object, reported by kubedev.
#[derive(Clone)]
pub struct NodeEvents {
    client: Client,
    node: String,
    instance: String,
}

impl std::fmt::Debug for NodeEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeEvents")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl NodeEvents {
    /// Events about `node`, reported by the daemon instance `instance` (e.g. its pod name, or
    /// `<driver>@<node>`).
    pub fn new(client: Client, node: impl Into<String>, instance: impl Into<String>) -> Self {
        NodeEvents {
            client,
            node: node.into(),
            instance: instance.into(),
        }
    }

    /// Records a Warning Event: `reason` and `action` in PascalCase, `note` a sentence (cut to
    /// [`MAX_EVENT_NOTE`] bytes at a character boundary).
    pub async fn warn(&self, reason: &str, action: &str, note: &str) -> Result<(), Error> {
        self.record(EventType::Warning, reason, action, note).await
    }

    async fn record(
        &self,
        type_: EventType,
        reason: &str,
        action: &str,
        note: &str,
    ) -> Result<(), Error> {
        let object = format!("Node {}", self.node);
        // The Node's UID ties the Event to this incarnation of the node; without it (no read
        // access, a transient error) the Event still names the node.
        let uid = Api::<Node>::all(self.client.clone())
            .get_opt(&self.node)
            .await
            .ok()
            .flatten()
            .and_then(|n| n.metadata.uid);
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(self.node.clone()),
            uid,
            ..Default::default()
        };
        let reporter = Reporter {
            controller: "kubedev".into(),
            instance: Some(self.instance.clone()),
        };
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(truncate(note, MAX_EVENT_NOTE).to_owned()),
            action: action.into(),
            secondary: None,
        };
        Recorder::new(self.client.clone(), reporter)
            .publish(&event, &reference)
            .await
            .map_err(|error| Error::Event {
                object,
                error: Box::new(error),
            })
    }
}

/// The longest prefix of `s` of at most `max` bytes that ends at a character boundary.
fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::truncate;

    #[test]
    fn notes_are_cut_at_a_character_boundary() {
        assert_eq!(truncate("abc", 10), "abc");
        assert_eq!(truncate("ab€", 4), "ab");
        assert_eq!(truncate(&"x".repeat(2000), 1024).len(), 1024);
    }
}
