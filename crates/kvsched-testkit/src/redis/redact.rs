//! Credentials out of the texts of a server the test kit owns.

use std::fmt;

/// A string that prints as `<redacted>`.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Secret(pub String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Replaces credentials in the text of a server this crate owns (its log, its replies to
/// setup commands: [`LocalRedis`](super::LocalRedis)). The library's tier errors never hold
/// a credential, so they pass through no redactor.
#[derive(Clone, Default)]
pub(crate) struct Redactor {
    secrets: Vec<String>,
}

impl Redactor {
    /// A redactor for these secrets (empty ones are ignored).
    pub fn new(secrets: impl IntoIterator<Item = String>) -> Redactor {
        let mut secrets: Vec<String> = secrets.into_iter().filter(|s| !s.is_empty()).collect();
        // Longest first, so a secret containing another is replaced whole.
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        Redactor { secrets }
    }

    /// `text` with every occurrence of a credential replaced by `***`.
    pub fn clean(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for s in &self.secrets {
            if !s.is_empty() && out.contains(s.as_str()) {
                out = out.replace(s.as_str(), "***");
            }
        }
        out
    }
}

impl fmt::Debug for Redactor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Redactor({} secrets)", self.secrets.len())
    }
}
