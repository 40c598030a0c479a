//! The model roles: what a service's evidence attests in its `role` field, the `gelo`
//! subcommand that serves it, and what the gateway routes to and the operator deploys.
//! Defined once, here, because the string is attested.

use std::{fmt, str::FromStr};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    Embedder,
    Reranker,
    Generator,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::Embedder, Role::Reranker, Role::Generator];

    /// The name used in evidence (`role`), flags, the routing table and messages.
    pub const fn as_str(self) -> &'static str {
        match self {
            Role::Embedder => "embedder",
            Role::Reranker => "reranker",
            Role::Generator => "generator",
        }
    }

    /// Position in [`Role::ALL`], for tables indexed by role.
    pub const fn index(self) -> usize {
        match self {
            Role::Embedder => 0,
            Role::Reranker => 1,
            Role::Generator => 2,
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Role::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| format!("unknown role `{s}` (embedder, reranker, generator)"))
    }
}
