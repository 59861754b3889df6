//! The write overlay: our own creates, updates and deletes laid over the ResourceSlice watch
//! cache until the watch shows them, so that a pass right after a write plans from it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceSlice;
use tokio::time::Instant;

/// How long our own writes override the watch cache when the watch has not shown them yet.
const WRITE_CACHE_TTL: Duration = Duration::from_secs(60);

pub(super) fn resource_version(slice: &ResourceSlice) -> Option<u64> {
    slice.metadata.resource_version.as_deref()?.parse().ok()
}

/// Our own writes, laid over the watch cache until the watch shows them (or a TTL passes):
/// without it a pass right after a create would not see the new slice and create it again.
#[derive(Debug, Default)]
pub(super) struct Overlay {
    entries: HashMap<String, OverlayEntry>,
}

#[derive(Debug)]
struct OverlayEntry {
    /// The object as the API server answered, or `None` for one we deleted (or found gone).
    object: Option<ResourceSlice>,
    rv: Option<u64>,
    expires: Instant,
}

impl Overlay {
    pub(super) fn put(&mut self, object: ResourceSlice) {
        let Some(name) = object.metadata.name.clone() else {
            return;
        };
        let rv = resource_version(&object);
        self.entries.insert(
            name,
            OverlayEntry {
                object: Some(object),
                rv,
                expires: Instant::now() + WRITE_CACHE_TTL,
            },
        );
    }

    pub(super) fn gone(&mut self, name: &str, rv: Option<u64>) {
        self.entries.insert(
            name.to_owned(),
            OverlayEntry {
                object: None,
                rv,
                expires: Instant::now() + WRITE_CACHE_TTL,
            },
        );
    }

    /// The slices as we know them: the watch cache with our newer writes on top. Entries the
    /// cache has caught up with are dropped. `observed` is the highest resourceVersion the
    /// watch has delivered: the cache reflects every change up to it.
    pub(super) fn view(
        &mut self,
        cached: Vec<Arc<ResourceSlice>>,
        observed: u64,
    ) -> Vec<ResourceSlice> {
        let now = Instant::now();
        let mut by_name: BTreeMap<String, ResourceSlice> = cached
            .into_iter()
            .filter_map(|s| Some((s.metadata.name.clone()?, (*s).clone())))
            .collect();
        self.entries.retain(|name, entry| {
            if now >= entry.expires {
                return false;
            }
            let cached = by_name.get(name);
            let cached_rv = cached.and_then(resource_version);
            match (&entry.object, entry.rv) {
                (Some(_), Some(rv)) => !(observed >= rv || cached_rv.is_some_and(|c| c >= rv)),
                (Some(_), None) => true,
                (None, rv) => match cached {
                    None => false,
                    Some(_) => !matches!((cached_rv, rv), (Some(c), Some(r)) if c > r),
                },
            }
        });
        for (name, entry) in &self.entries {
            match &entry.object {
                Some(object) => {
                    by_name.insert(name.clone(), object.clone());
                }
                None => {
                    by_name.remove(name);
                }
            }
        }
        by_name.into_values().collect()
    }

    pub(super) fn next_expiry(&self) -> Option<Instant> {
        self.entries.values().map(|e| e.expires).min()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn slice(name: &str, rv: u64, pool: &str) -> ResourceSlice {
        let mut s = ResourceSlice::default();
        s.metadata.name = Some(name.into());
        s.metadata.resource_version = Some(rv.to_string());
        s.spec.pool.name = pool.into();
        s
    }

    fn names(view: &[ResourceSlice]) -> Vec<(&str, &str)> {
        view.iter()
            .map(|s| {
                (
                    s.metadata.name.as_deref().unwrap(),
                    s.spec.pool.name.as_str(),
                )
            })
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn overlay_shows_writes_until_the_cache_catches_up() {
        let mut overlay = Overlay::default();
        let cached = vec![Arc::new(slice("a", 5, "old"))];
        overlay.put(slice("a", 7, "new"));
        overlay.put(slice("b", 8, "created"));
        // The watch has not shown either write.
        let view = overlay.view(cached.clone(), 5);
        assert_eq!(names(&view), vec![("a", "new"), ("b", "created")]);
        // The cache now holds a's update: a's entry goes, b's stays.
        let view = overlay.view(vec![Arc::new(slice("a", 7, "new"))], 7);
        assert_eq!(names(&view), vec![("a", "new"), ("b", "created")]);
        assert_eq!(overlay.entries.len(), 1);
        // The watch is past b's version but the cache has no b: someone deleted it.
        let view = overlay.view(vec![Arc::new(slice("a", 7, "new"))], 9);
        assert_eq!(names(&view), vec![("a", "new")]);
        assert!(overlay.entries.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn overlay_hides_deleted_slices_until_the_cache_drops_them() {
        let mut overlay = Overlay::default();
        overlay.gone("a", Some(5));
        let view = overlay.view(vec![Arc::new(slice("a", 5, "p"))], 100);
        assert!(view.is_empty());
        // A newer object of the same name (re-created by someone) is shown again.
        let view = overlay.view(vec![Arc::new(slice("a", 6, "p"))], 100);
        assert_eq!(names(&view), vec![("a", "p")]);
        assert!(overlay.entries.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn overlay_entries_expire() {
        let mut overlay = Overlay::default();
        overlay.put(slice("b", 8, "created"));
        assert_eq!(overlay.view(Vec::new(), 0).len(), 1);
        let expiry = overlay.next_expiry().unwrap();
        tokio::time::sleep_until(expiry).await;
        assert!(overlay.view(Vec::new(), 0).is_empty());
        assert_eq!(overlay.next_expiry(), None);
    }
}
