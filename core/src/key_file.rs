//! The file of `snowflake_id.public_key_file`: the keys of public IDs, kept
//! out of every setting's value (PostgreSQL logs changed values and shows
//! them to `pg_read_all_settings`). Checked as PostgreSQL checks
//! `ssl_key_file`: owned by the server's OS user with no access for group
//! or others, or owned by root with at most group read. Pure: the caller
//! resolves the path and says who the server's OS user is.
//!
//! No text of the file ever goes into an error: problems name the key by
//! its position only.

use crate::public_id::{self, Key};
use std::fmt;
use std::io::{ErrorKind, Read};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// A key file longer than this is refused (8 keys take under 300 bytes).
pub const MAX_FILE_BYTES: u64 = 64 * 1024;

/// Why the keys could not be read from the file.
#[derive(Debug)]
pub enum KeyFileError {
    /// The file (or a directory above it) does not exist.
    Missing(std::io::Error),
    /// The server's OS user may not open it (or a directory above it).
    Denied(std::io::Error),
    /// Another I/O error.
    Io(std::io::Error),
    /// Owned by neither the server's OS user nor root.
    Owner { uid: u32 },
    /// Group or others have access it must not have.
    Mode { mode: u32 },
    /// A directory, a device or a pipe.
    NotFile,
    /// The content is not a list of keys.
    Content(String),
}

impl fmt::Display for KeyFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyFileError::Missing(e) | KeyFileError::Denied(e) | KeyFileError::Io(e) => {
                write!(f, "{}", io_text(e))
            }
            KeyFileError::Owner { uid } => write!(
                f,
                "it is owned by uid {uid}, not by the database server's OS user or root"
            ),
            KeyFileError::Mode { mode } => write!(
                f,
                "it has group or world access (mode {:04o})",
                mode & 0o7777
            ),
            KeyFileError::NotFile => write!(f, "it is not a regular file"),
            KeyFileError::Content(problem) => write!(f, "{problem}"),
        }
    }
}

/// An I/O error as PostgreSQL's `%m` prints it, without Rust's "(os error N)".
fn io_text(e: &std::io::Error) -> String {
    let text = e.to_string();
    match text.find(" (os error") {
        Some(at) => text[..at].to_string(),
        None => text,
    }
}

/// Reads and checks the keys in the file at `path`. `server_uid`: the
/// effective uid of the server. The checks are made on the opened file,
/// so a file swapped in between cannot slip through.
pub fn read_keys(path: &Path, server_uid: u32) -> Result<Vec<Key>, KeyFileError> {
    let open_error = |e: std::io::Error| match e.kind() {
        ErrorKind::NotFound | ErrorKind::NotADirectory => KeyFileError::Missing(e),
        ErrorKind::PermissionDenied => KeyFileError::Denied(e),
        _ => KeyFileError::Io(e),
    };
    let file = std::fs::File::open(path).map_err(open_error)?;
    let meta = file.metadata().map_err(KeyFileError::Io)?;
    if !meta.is_file() {
        return Err(KeyFileError::NotFile);
    }
    let (uid, mode) = (meta.uid(), meta.mode());
    if uid != server_uid && uid != 0 {
        return Err(KeyFileError::Owner { uid });
    }
    // As PostgreSQL's be_tls_init() for ssl_key_file: u=rw (0600) or less
    // when owned by the server's user, u=rw,g=r (0640) or less by root.
    let forbidden = if uid == server_uid { 0o077 } else { 0o037 };
    if mode & forbidden != 0 {
        return Err(KeyFileError::Mode { mode });
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(KeyFileError::Content(format!(
            "the file has {} bytes; a key file has at most {MAX_FILE_BYTES}",
            meta.len()
        )));
    }
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(KeyFileError::Io)?;
    let text = std::str::from_utf8(&bytes).map_err(|_| {
        KeyFileError::Content("the file is not text (it has bytes that are not UTF-8)".into())
    })?;
    parse(text).map_err(KeyFileError::Content)
}

/// The keys in a key file's text: keys of 32 hex digits, separated by
/// commas or line breaks, the first making tokens and all reading them.
/// Blank lines and lines starting with `#` are skipped.
pub fn parse(text: &str) -> Result<Vec<Key>, String> {
    let parts: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|line| !line.starts_with('#'))
        .flat_map(|line| line.split(','))
        .map(str::trim)
        .filter(|part| !part.is_empty())
        .collect();
    if parts.is_empty() {
        return Err("the file holds no key".into());
    }
    public_id::parse_keys(&parts.join(",")).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    const K1: &str = "000102030405060708090a0b0c0d0e0f";
    const K2: &str = "f0e1d2c3b4a5968778695a4b3c2d1e0f";

    #[test]
    fn parses_lines_commas_and_comments() {
        assert_eq!(parse(&format!("{K1}\n")).map(|k| k.len()), Ok(1));
        assert_eq!(
            parse(&format!("# new first\n{K2}\n\n{K1}\n")).map(|k| k.len()),
            Ok(2)
        );
        assert_eq!(parse(&format!(" {K2} , {K1}\r\n")).map(|k| k.len()), Ok(2));
        assert_eq!(parse("\n# nothing\n"), Err("the file holds no key".into()));
        let bad = parse(&format!("{K1}\n{}", &K2[..31])).unwrap_err();
        assert!(bad.contains("key 2 has 31 characters"), "{bad}");
        assert!(!bad.contains(&K2[..31]));
    }

    #[test]
    fn checks_owner_and_mode() {
        let dir = std::env::temp_dir().join(format!("sf_keyfile_{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("keys");
        std::fs::write(&path, format!("{K1}\n")).unwrap();
        let uid = std::fs::metadata(&path).unwrap().uid();
        let chmod = |mode| std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode));
        chmod(0o600).unwrap();
        if uid != 0 {
            assert!(read_keys(&path, uid).is_ok());
            assert!(matches!(
                read_keys(&path, uid + 1),
                Err(KeyFileError::Owner { .. })
            ));
            chmod(0o640).unwrap();
            assert!(matches!(
                read_keys(&path, uid),
                Err(KeyFileError::Mode { .. })
            ));
        } else {
            // Owned by root: group read is allowed, as for ssl_key_file.
            chmod(0o640).unwrap();
            assert!(read_keys(&path, 1234).is_ok());
            chmod(0o660).unwrap();
            assert!(matches!(
                read_keys(&path, 1234),
                Err(KeyFileError::Mode { .. })
            ));
            chmod(0o604).unwrap();
            assert!(matches!(
                read_keys(&path, 1234),
                Err(KeyFileError::Mode { .. })
            ));
        }
        assert!(matches!(
            read_keys(&dir.join("none"), uid),
            Err(KeyFileError::Missing(_))
        ));
        assert!(matches!(read_keys(&dir, uid), Err(KeyFileError::NotFile)));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
