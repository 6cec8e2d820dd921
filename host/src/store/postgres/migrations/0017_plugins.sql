-- Plugins installed through one host for every host sharing the database
-- (`SharedPlugins`): the operator's (scope '') and each account's own
-- (scope: the account's id), by name; their components' bytes by hash,
-- kept while a plugin names them.
CREATE TABLE plugins (
    scope TEXT NOT NULL,
    name TEXT NOT NULL,
    manifest TEXT NOT NULL,
    component TEXT NOT NULL,
    PRIMARY KEY (scope, name)
);
CREATE INDEX plugins_by_component ON plugins (component);
CREATE TABLE plugin_components (
    hash TEXT PRIMARY KEY,
    bytes BYTEA NOT NULL
);
