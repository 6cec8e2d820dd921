//! Following the plugins installed into every host sharing a store
//! (`store::cluster::SharedPlugins`): the operator's, and each account's
//! own. An install or removal through one host is written to the store
//! (see `live`); every other host hears of the scope it changed and brings
//! its own copy in step: it fetches the component, compiles and checks it
//! under its own limits, keeps it marked with the revision it followed,
//! and removes a marked plugin the store no longer has.
//!
//! Each scope is followed in its turn (the lock installs through this host
//! take), and re-read in it before anything changes, so a follow never
//! undoes an install this host just made. A plugin kept here from before
//! the host shared a store (never marked) is written to the store once,
//! so every host gets it. A revision that does not load here (a host with
//! other plugins, where its classes are taken) is left out with a warning
//! and not tried again until it changes; jobs needing it wait for a host
//! that has it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::Arc;

use super::live::{ACCOUNT_INSTALLS_DIR, INSTALLS_DIR, InstallError, LivePlugins, Origin, mark, mark_of};
use super::manifest::Manifest;
use crate::store::StoreError;
use crate::store::cluster::{OPERATOR_SCOPE, Publish, Published, SharedPlugin, SharedPlugins};

/// What one scope needs here to match the store.
#[derive(Debug, Default, PartialEq)]
struct Plan {
    /// Plugins the store has in another revision than here, or not here.
    install: Vec<SharedPlugin>,
    /// Plugins kept here, marked as shared, that the store no longer has.
    remove: Vec<String>,
    /// Plugins kept here never shared: written to the store.
    adopt: Vec<String>,
}

impl Plan {
    /// The plan for a scope whose plugins are kept in `dir`, where `here`
    /// are loaded, and of which the store has `wanted`.
    fn of(dir: &Path, here: &[String], wanted: &[SharedPlugin], refused: &HashMap<(String, String), String>) -> Plan {
        let mut plan = Plan::default();
        for row in wanted {
            let revision = row.revision();
            let current = here.contains(&row.name) && mark_of(&dir.join(&row.name)).as_deref() == Some(revision.as_str());
            if !current && refused.get(&(row.scope.clone(), row.name.clone())) != Some(&revision) {
                plan.install.push(row.clone());
            }
        }
        for name in here.iter().filter(|name| !wanted.iter().any(|row| &row.name == *name)) {
            if mark_of(&dir.join(name)).is_some() { plan.remove.push(name.clone()) } else { plan.adopt.push(name.clone()) }
        }
        plan
    }

    fn is_empty(&self) -> bool {
        self.install.is_empty() && self.remove.is_empty() && self.adopt.is_empty()
    }
}

/// The rows whose name is their manifest's (a row is a folder's name here).
fn checked(rows: Vec<SharedPlugin>) -> Vec<SharedPlugin> {
    rows.into_iter()
        .filter(|row| {
            let fits = Manifest::parse(&row.manifest).is_ok_and(|m| m.name == row.name);
            if !fits {
                tracing::warn!(scope = %row.scope, plugin = %row.name, "a shared plugin's manifest does not parse here or names another plugin; left out");
            }
            fits
        })
        .collect()
}

/// The component of `row`, checked against its hash; `None` when the store
/// no longer has it (the plugin changed again: its notice follows).
async fn fetch(shared: &dyn SharedPlugins, row: &SharedPlugin) -> Result<Option<Vec<u8>>, StoreError> {
    let Some(bytes) = shared.component(&row.component).await? else { return Ok(None) };
    if blake3::hash(&bytes).to_hex().as_str() != row.component {
        return Err(StoreError::Corrupt(format!("shared plugin {}: its component does not hash to {}", row.name, row.component)));
    }
    Ok(Some(bytes))
}

/// The plugin kept in `dir` as `scope`'s, as the shared store keeps it,
/// with its component's bytes.
pub fn read_kept(scope: &str, dir: &Path) -> Result<(SharedPlugin, Vec<u8>), InstallError> {
    let named = |e: std::io::Error| InstallError::Io(std::io::Error::new(e.kind(), format!("{}: {e}", dir.display())));
    let text = std::fs::read_to_string(dir.join("kiln-plugin.toml")).map_err(named)?;
    let manifest = Manifest::parse(&text)?;
    let wasm = std::fs::read(dir.join(&manifest.component)).map_err(named)?;
    let record = SharedPlugin { scope: scope.to_string(), name: manifest.name, manifest: text, component: blake3::hash(&wasm).to_hex().to_string() };
    Ok((record, wasm))
}

/// The plugins installed into the data directory `data_dir`, the
/// operator's and accounts' own: each one's scope and folder (read one at
/// a time with [`read_kept`]): what `kiln migrate` copies.
pub fn kept_in(data_dir: &Path) -> std::io::Result<Vec<(String, std::path::PathBuf)>> {
    use super::account_plugins::{OWNER_FILE, subdirs};
    let mut kept = Vec::new();
    let installs = data_dir.join(INSTALLS_DIR);
    if installs.is_dir() {
        kept.extend(subdirs(&installs)?.into_iter().map(|dir| (OPERATOR_SCOPE.to_string(), dir)));
    }
    let accounts = data_dir.join(ACCOUNT_INSTALLS_DIR);
    if accounts.is_dir() {
        for account_dir in subdirs(&accounts)? {
            let Ok(owner) = std::fs::read_to_string(account_dir.join(OWNER_FILE)) else { continue };
            kept.extend(subdirs(&account_dir)?.into_iter().map(|dir| (owner.clone(), dir)));
        }
    }
    Ok(kept)
}

/// Writes the plugin kept in `dir` (installed before this host shared a
/// store) to the store as `scope`'s where the scope has none of its name,
/// and marks it; what the store did.
async fn adopt(shared: &dyn SharedPlugins, scope: &str, dir: &Path, limit: Option<usize>) -> Result<Published, InstallError> {
    let (record, wasm) = read_kept(scope, dir)?;
    let published = shared.publish(&record, &wasm, Publish { limit, replace: false }).await?;
    if published == Published::Done {
        mark(dir, &record.revision())?;
    }
    Ok(published)
}

/// What became of one followed install.
enum Followed {
    Installed,
    /// It does not load here: not tried again until it changes.
    Refused,
    /// It could not be kept here now (the disk, the store): tried again.
    Later,
}

/// The component of `row` to install, or why not.
async fn component_of(shared: &dyn SharedPlugins, row: &SharedPlugin) -> Result<Option<Vec<u8>>, Result<InstallError, StoreError>> {
    match fetch(shared, row).await {
        Ok(bytes) => Ok(bytes),
        // Bytes that do not hash to the record: this revision is refused.
        Err(e @ StoreError::Corrupt(_)) => Err(Ok(InstallError::Shared(e))),
        Err(e) => Err(Err(e)),
    }
}

impl LivePlugins {
    /// Brings this host's installed plugins of `scopes` (every scope's:
    /// `None`) in step with the store the hosts share; nothing where there
    /// is none. A plugin that does not load here is left out (logged); the
    /// store not answering is the error.
    pub async fn follow_shared(&self, scopes: Option<Vec<String>>) -> Result<(), StoreError> {
        let Some(shared) = self.shared.clone() else { return Ok(()) };
        let mut by_scope: BTreeMap<String, Vec<SharedPlugin>> = BTreeMap::new();
        for row in checked(shared.plugins(scopes.clone()).await?) {
            by_scope.entry(row.scope.clone()).or_default().push(row);
        }
        // The operator's scope first (it sorts first).
        let looked: BTreeSet<String> = match scopes {
            Some(scopes) => scopes.into_iter().collect(),
            None => std::iter::once(OPERATOR_SCOPE.to_string())
                .chain(by_scope.keys().cloned())
                .chain(self.accounts.iter().flat_map(|accounts| accounts.owners()))
                .collect(),
        };
        let mut first_error = None;
        for scope in looked {
            let hint = by_scope.remove(&scope).unwrap_or_default();
            let followed =
                if scope == OPERATOR_SCOPE { self.follow_operator(&*shared, &hint).await } else { self.follow_account(&*shared, &scope, &hint).await };
            if let Err(e) = followed {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// The operator's plugins, in the turn installs through this host take.
    async fn follow_operator(&self, shared: &dyn SharedPlugins, hint: &[SharedPlugin]) -> Result<(), StoreError> {
        let Some(installs) = &self.installs else { return Ok(()) };
        let _turn = installs.changing.lock().await;
        let here = || -> Vec<String> {
            let current = self.current();
            current.plugins().iter().filter(|p| !self.fixed.iter().any(|f| Arc::ptr_eq(f, p))).map(|p| p.manifest.name.clone()).collect()
        };
        let Some(plan) = self.plan(shared, OPERATOR_SCOPE, &installs.dir, &here, hint).await? else { return Ok(()) };
        for row in plan.install {
            let installed = match component_of(shared, &row).await {
                Ok(None) => continue,
                Ok(Some(bytes)) => self.install_locked(installs, &row.manifest, bytes, Origin::Shared(row.revision())).await,
                Err(Ok(refused)) => Err(refused),
                Err(Err(e)) => return Err(e),
            };
            // A revision refused here takes the one before it out too: a
            // host serves the plugin's current version or none.
            if matches!(self.followed(&row, installed), Followed::Refused) && here().contains(&row.name) {
                self.removed(OPERATOR_SCOPE, &row.name, self.remove_locked(installs, &row.name).await);
            }
        }
        for name in plan.remove {
            self.removed(OPERATOR_SCOPE, &name, self.remove_locked(installs, &name).await);
        }
        for name in plan.adopt {
            // The operator's scope has no limit: never full.
            self.adopted(OPERATOR_SCOPE, &name, adopt(shared, OPERATOR_SCOPE, &installs.dir.join(&name), None).await);
        }
        Ok(())
    }

    /// `owner`'s own plugins, in the account's turn.
    async fn follow_account(&self, shared: &dyn SharedPlugins, owner: &str, hint: &[SharedPlugin]) -> Result<(), StoreError> {
        let Some(accounts) = &self.accounts else { return Ok(()) };
        let turn = accounts.turn(owner);
        let _turn = turn.lock().await;
        let dir = accounts.account_dir(owner);
        let here = || accounts.names(owner);
        let Some(plan) = self.plan(shared, owner, &dir, &here, hint).await? else { return Ok(()) };
        let base = self.current();
        let mut outcome = Ok(());
        for row in plan.install {
            let installed = match component_of(shared, &row).await {
                Ok(None) => continue,
                Ok(Some(bytes)) => accounts.install_locked(owner, &base, (&row.manifest, bytes), Some(shared), Origin::Shared(row.revision())).await,
                Err(Ok(refused)) => Err(refused),
                Err(Err(e)) => {
                    outcome = Err(e);
                    break;
                }
            };
            if matches!(self.followed(&row, installed), Followed::Refused) && here().contains(&row.name) {
                self.removed(owner, &row.name, accounts.remove_locked(owner, &base, &row.name).await);
            }
        }
        for name in plan.remove {
            self.removed(owner, &name, accounts.remove_locked(owner, &base, &name).await);
        }
        for name in plan.adopt {
            let adopted = adopt(shared, owner, &dir.join(&name), Some(accounts.max_plugins())).await;
            // Kept on several hosts before, the account's plugins may be
            // over its limit together: those that do not fit are removed.
            if matches!(adopted, Ok(Published::Full)) {
                self.removed(owner, &name, accounts.remove_locked(owner, &base, &name).await);
            }
            self.adopted(owner, &name, adopted);
        }
        self.after_account_change(accounts, &base);
        outcome
    }

    /// What `scope` needs here (`None`: nothing). The `hint` was read before
    /// the scope's turn; when it calls for a change the scope is read
    /// again, in the turn, and that reading decides. Refusals of plugins
    /// the store no longer has are forgotten.
    async fn plan(
        &self,
        shared: &dyn SharedPlugins,
        scope: &str,
        dir: &Path,
        here: &(dyn Fn() -> Vec<String> + Sync),
        hint: &[SharedPlugin],
    ) -> Result<Option<Plan>, StoreError> {
        let forget = |wanted: &[SharedPlugin]| self.refused.lock().retain(|(s, name), _| s != scope || wanted.iter().any(|row| &row.name == name));
        forget(hint);
        if Plan::of(dir, &here(), hint, &self.refused.lock()).is_empty() {
            return Ok(None);
        }
        let wanted = checked(shared.plugins(Some(vec![scope.to_string()])).await?);
        forget(&wanted);
        let plan = Plan::of(dir, &here(), &wanted, &self.refused.lock());
        Ok((!plan.is_empty()).then_some(plan))
    }

    /// Logs a followed install: one that does not load here is not tried
    /// again until its revision changes; one that could not be kept here
    /// now is followed again soon ([`LivePlugins::take_pending`]).
    fn followed(&self, row: &SharedPlugin, installed: Result<super::PluginInfo, InstallError>) -> Followed {
        let key = (row.scope.clone(), row.name.clone());
        match installed {
            Ok(info) => {
                self.refused.lock().remove(&key);
                tracing::info!(scope = %row.scope, plugin = %info.name, hash = %info.hash, "plugin installed through another host");
                Followed::Installed
            }
            Err(e @ (InstallError::Io(_) | InstallError::Shared(StoreError::Unavailable(_) | StoreError::Io(_) | StoreError::Backend(_)))) => {
                tracing::warn!(scope = %row.scope, plugin = %row.name, error = %e, "cannot keep a plugin installed through another host yet; trying again");
                self.pending.lock().insert(row.scope.clone());
                Followed::Later
            }
            Err(e) => {
                tracing::warn!(scope = %row.scope, plugin = %row.name, error = %e, "a plugin installed through another host does not load here; left out");
                self.refused.lock().insert(key, row.revision());
                Followed::Refused
            }
        }
    }

    fn removed(&self, scope: &str, name: &str, removed: Result<(), InstallError>) {
        match removed {
            Ok(()) => tracing::info!(scope = %scope, plugin = %name, "plugin removed (through another host, or its current version does not load here)"),
            Err(e) => {
                tracing::warn!(scope = %scope, plugin = %name, error = %e, "cannot remove a plugin here; trying again");
                self.pending.lock().insert(scope.to_string());
            }
        }
    }

    fn adopted(&self, scope: &str, name: &str, adopted: Result<Published, InstallError>) {
        match adopted {
            Ok(Published::Done) => tracing::info!(scope = %scope, plugin = %name, "a plugin kept here is now every host's"),
            Ok(Published::Present) => {
                tracing::info!(scope = %scope, plugin = %name, "a plugin kept here gives way to the one every host has");
                self.pending.lock().insert(scope.to_string());
            }
            Ok(Published::Full) => tracing::warn!(scope = %scope, plugin = %name, "a plugin kept here is over its account's limit across hosts; removed"),
            Err(e) => tracing::warn!(scope = %scope, plugin = %name, error = %e, "cannot share a plugin kept here"),
        }
    }
}

#[cfg(test)]
mod tests;
