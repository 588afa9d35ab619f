//! Reading a request path as the router and as a wildcard handler read
//! it, and matching it against route prefixes.

use std::borrow::Cow;

use percent_encoding::percent_decode;

/// `path` as the router reads it: each `%XX` decoded once (as path
/// parameters are), save `%2F`, which stays one segment; so no spelling of a
/// path steps around its route's limit.
pub(crate) fn normal_path(path: &str) -> Cow<'_, [u8]> {
    if !path.as_bytes().contains(&b'%') {
        return Cow::Borrowed(path.as_bytes());
    }
    // Decoded between the `%2F`s, each written back (one more, then cut).
    let mut out = Vec::with_capacity(path.len() + 3);
    for piece in path.split("%2F").flat_map(|p| p.split("%2f")) {
        out.extend(percent_decode(piece.as_bytes()));
        out.extend_from_slice(b"%2F");
    }
    out.truncate(out.len() - 3);
    Cow::Owned(out)
}

/// `path` as a wildcard handler reading a file path gets it (as
/// `ServeDir` does): all `%XX` decoded, empty and `.` segments dropped, a
/// trailing `/` kept, `..` left as is.
pub(super) fn second_reading(path: &[u8]) -> Vec<u8> {
    let path: Vec<u8> = percent_decode(path).collect();
    if !path.starts_with(b"/") {
        return path;
    }
    let mut out = Vec::with_capacity(path.len());
    let mut trailing = false;
    for segment in path.split(|&b| b == b'/').skip(1) {
        trailing = segment.is_empty() || segment == b".";
        if !trailing {
            out.push(b'/');
            out.extend_from_slice(segment);
        }
    }
    if trailing || out.is_empty() {
        out.push(b'/');
    }
    out
}

/// Whether `path` has a segment that [`second_reading`] drops.
pub(super) fn has_dot_or_empty_segment(path: &[u8]) -> bool {
    let mut segments = path.split(|&b| b == b'/').skip(1);
    path.windows(2).any(|w| w == b"//") || segments.any(|s| s == b".")
}

/// `path` is `prefix` or continues it after a `/`.
pub(super) fn prefix_matches(path: &[u8], prefix: &[u8]) -> bool {
    path.starts_with(prefix)
        && (path.len() == prefix.len()
            || prefix.last() == Some(&b'/')
            || path[prefix.len()] == b'/')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_matches_on_segment_boundaries_only() {
        assert!(prefix_matches(b"/api/hooks", b"/api/hooks"));
        assert!(prefix_matches(b"/api/hooks/stripe", b"/api/hooks"));
        assert!(!prefix_matches(b"/api/hooksx", b"/api/hooks"));
        assert!(prefix_matches(b"/api/hooks/x", b"/api/"));
        assert!(prefix_matches(b"/anything", b"/"));
        assert!(!prefix_matches(b"/api", b"/api/hooks"));
    }

    #[test]
    fn normal_paths_decode_every_percent_encoding_once() {
        let form = |p: &str| normal_path(p).into_owned();
        assert_eq!(form("/hooks/stripe"), b"/hooks/stripe");
        assert!(matches!(normal_path("/a/b"), Cow::Borrowed(_)));
        assert_eq!(form("/hooks/%73tripe"), b"/hooks/stripe");
        assert_eq!(form("/%41%7a%30%2D%2e%5F%7e"), b"/Az0-._~");
        // Reserved and other characters too, in either case of hex digit,
        // the same bytes as the character sent raw.
        assert_eq!(form("/users/%40me"), form("/users/@me"));
        assert_eq!(form("/hooks/caf%c3%A9"), form("/hooks/caf\u{e9}"));
        assert_eq!(form("/q/%7Bx%7d%22"), b"/q/{x}\"");
        // A `/` inside a segment stays encoded: not a segment boundary.
        assert_eq!(form("/files/a%2fb"), b"/files/a%2Fb");
        assert_ne!(form("/files/a%2Fb"), form("/files/a/b"));
        // Once: `%25` is a `%`, not the start of another encoding.
        assert_eq!(form("/a%2541"), b"/a%41");
        // Bytes that are not UTF-8 are compared as bytes.
        assert_eq!(form("/x%FF"), b"/x\xff");
        // Not an encoding: left as it is.
        assert_eq!(form("/100%/%zz/%4"), b"/100%/%zz/%4");
    }

    #[test]
    fn the_second_reading_drops_dot_and_empty_segments_only() {
        let read = |p: &str| String::from_utf8(second_reading(p.as_bytes())).unwrap();
        for (path, reads) in [
            ("/", "/"),
            ("/a", "/a"),
            ("/a/", "/a/"),
            ("/a/./b", "/a/b"),
            ("/a//b", "/a/b"),
            ("/a/.", "/a/"),
            ("/a//", "/a/"),
            ("/./", "/"),
            ("//", "/"),
            ("/.a/b./.../c", "/.a/b./.../c"),
            ("/a/../b", "/a/../b"),
            ("/a%2F%2E/b", "/a/b"),
            ("/a%2F.%2F/b", "/a/b"),
        ] {
            assert_eq!(read(path), reads, "{path}");
            if !path.contains('%') {
                assert_eq!(
                    has_dot_or_empty_segment(path.as_bytes()),
                    path != reads,
                    "{path}"
                );
            }
        }
    }
}
