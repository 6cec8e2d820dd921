//! Compatibility HTTP routes.
