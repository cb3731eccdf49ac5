//! How the caching allocator is switched on and bounded: `CUDABUF_ALLOCATOR_CACHE` and the
//! per-backend default.

use std::sync::OnceLock;

use crate::backend::BackendKind;

/// The environment variable that configures the caching allocator (and the pool of pinned
/// staging buffers): `0`/`off` disables them, `1`/`on` enables them with the default
/// limit, a size (`512M`, `8G`, `1073741824`) enables them with that limit of cached
/// device bytes. Read once per process.
pub const ALLOCATOR_CACHE_VAR: &str = "CUDABUF_ALLOCATOR_CACHE";

/// The default limit of cached device bytes per device context (when the cache is on).
pub const DEFAULT_CACHE_LIMIT: usize = 4 << 30;

/// Parse a byte size such as `4096`, `64K`, `512M`, `8G` (binary units, case-insensitive,
/// an optional trailing `B` or `iB`), as cudabuf's environment variables take them.
///
/// ```
/// assert_eq!(cudabuf_core::parse_size("64KiB"), Some(64 << 10));
/// assert_eq!(cudabuf_core::parse_size("lots"), None);
/// ```
pub fn parse_size(text: &str) -> Option<usize> {
    let t = text.trim().to_ascii_uppercase();
    let t = t
        .strip_suffix("IB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(&t);
    let (digits, shift) = match t.chars().last()? {
        'K' => (&t[..t.len() - 1], 10),
        'M' => (&t[..t.len() - 1], 20),
        'G' => (&t[..t.len() - 1], 30),
        'T' => (&t[..t.len() - 1], 40),
        _ => (t, 0),
    };
    let n: usize = digits.trim().parse().ok()?;
    n.checked_mul(1usize << shift)
}

/// What `CUDABUF_ALLOCATOR_CACHE` says: `None` when unset (use the backend's default),
/// `Some(0)` for off, `Some(limit)` for on.
fn env_limit() -> Option<usize> {
    static LIMIT: OnceLock<Option<usize>> = OnceLock::new();
    *LIMIT.get_or_init(|| {
        let value = std::env::var(ALLOCATOR_CACHE_VAR).ok()?;
        match value.trim().to_ascii_lowercase().as_str() {
            "" => None,
            "0" | "off" | "false" | "no" => Some(0),
            "1" | "on" | "true" | "yes" => Some(DEFAULT_CACHE_LIMIT),
            other => match parse_size(other) {
                Some(limit) => Some(limit),
                None => {
                    log::warn!(
                        "{ALLOCATOR_CACHE_VAR}={value:?} is not 0, 1 or a size; \
                         using the backend's default"
                    );
                    None
                }
            },
        }
    })
}

/// The cache limit a device context of `kind` starts with: on (4 GiB) for CUDA, off for
/// the simulator, unless `CUDABUF_ALLOCATOR_CACHE` says otherwise.
pub(crate) fn default_limit(kind: BackendKind) -> usize {
    // A backend outside this repository starts with the cache on, as CUDA does: the
    // simulator turns it off only to report every leak and use after free exactly.
    env_limit().unwrap_or(if kind == BackendKind::SIM {
        0
    } else {
        DEFAULT_CACHE_LIMIT
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("64k"), Some(64 << 10));
        assert_eq!(parse_size("512M"), Some(512 << 20));
        assert_eq!(parse_size("8GiB"), Some(8 << 30));
        assert_eq!(parse_size("2gb"), Some(2 << 30));
        assert_eq!(parse_size("x"), None);
        assert_eq!(parse_size(""), None);
    }
}
