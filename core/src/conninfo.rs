//! Connection strings as libpq reads them, only as far as needed to tell
//! whether one holds a password, and to name each of its hosts (pure). A setting's value is readable by
//! every member of `pg_read_all_settings` and written to the log when it
//! changes, so `snowflake_id.registry` must not hold a secret: libpq reads
//! passwords from a passfile (`~/.pgpass` of the server's OS user, or
//! `passfile=`) instead.

/// The libpq keywords whose value is a secret.
const SECRET_KEYWORDS: [&str; 2] = ["password", "sslpassword"];

/// Where a connection string holds a secret, if it does: the keyword
/// (`password`, `sslpassword`), or `user:password@` in a URI. Never the
/// secret itself. Text that libpq could not parse holds none as far as this
/// can tell; the parser of the setting reports it.
pub fn secret_in(conninfo: &str) -> Option<&'static str> {
    let text = conninfo.trim_start();
    if uri_prefix_len(text).is_some() {
        secret_in_uri(text)
    } else {
        secret_in_keywords(text)
    }
}

/// Length of `postgresql://` or `postgres://` at the start of `text`.
fn uri_prefix_len(text: &str) -> Option<usize> {
    ["postgresql://", "postgres://"].iter().find_map(|prefix| {
        text.get(..prefix.len())
            .filter(|head| head.eq_ignore_ascii_case(prefix))
            .map(|_| prefix.len())
    })
}

fn secret_keyword(key: &str) -> Option<&'static str> {
    SECRET_KEYWORDS
        .iter()
        .find(|k| k.eq_ignore_ascii_case(key.trim()))
        .copied()
}

/// A `dbname` value that is itself a connection string (libpq expands one
/// when it is given as the `dbname` of a parameter array).
fn nested_secret(key: &str, value: &str) -> Option<&'static str> {
    let looks_like_conninfo = value.contains('=') || uri_prefix_len(value.trim_start()).is_some();
    if key.trim().eq_ignore_ascii_case("dbname") && looks_like_conninfo {
        secret_in(value)
    } else {
        None
    }
}

/// `keyword = value` pairs separated by whitespace; values may be
/// single-quoted, and a backslash escapes the next character.
fn secret_in_keywords(text: &str) -> Option<&'static str> {
    // Text that does not parse holds none as far as this can tell; a
    // password before the bad part is still found.
    let (pairs, _) = pairs(text);
    pairs
        .iter()
        .find_map(|(key, value)| secret_keyword(key).or_else(|| nested_secret(key, value)))
}

/// The `keyword = value` pairs of `text`, and what stopped the parse
/// early, if anything.
fn pairs(text: &str) -> (Vec<(String, String)>, Option<&'static str>) {
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            return (out, None);
        }
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| !c.is_whitespace() && *c != '=') {
            key.push(c);
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.next_if_eq(&'=').is_none() {
            return (out, Some("a keyword without \"=\""));
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            loop {
                match chars.next() {
                    None => return (out, Some("an unterminated quoted value")),
                    Some('\'') => break,
                    Some('\\') => match chars.next() {
                        Some(c) => value.push(c),
                        None => return (out, Some("an unterminated quoted value")),
                    },
                    Some(c) => value.push(c),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                match c {
                    '\\' => {
                        if let Some(escaped) = chars.next() {
                            value.push(escaped);
                        }
                    }
                    c => value.push(c),
                }
            }
        }
        out.push((key, value));
    }
}

/// libpq's connection keywords (PostgreSQL 15 to 18).
const KEYWORDS: [&str; 47] = [
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "passfile",
    "channel_binding",
    "connect_timeout",
    "client_encoding",
    "options",
    "application_name",
    "fallback_application_name",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "tcp_user_timeout",
    "replication",
    "gssencmode",
    "sslmode",
    "sslnegotiation",
    "sslcompression",
    "sslcert",
    "sslkey",
    "sslpassword",
    "sslcertmode",
    "sslrootcert",
    "sslcrl",
    "sslcrldir",
    "sslsni",
    "requirepeer",
    "ssl_min_protocol_version",
    "ssl_max_protocol_version",
    "krbsrvname",
    "gsslib",
    "gssdelegation",
    "service",
    "target_session_attrs",
    "load_balance_hosts",
    "require_auth",
    "min_protocol_version",
    "max_protocol_version",
    "scram_client_key",
    "scram_server_key",
    "sslkeylogfile",
    "oauth_issuer",
];

/// What makes `text` a connection string libpq would refuse, as far as
/// can be told without libpq (which is loaded by the lease worker only:
/// a second libpq in every server process would take the place of the
/// server's own in its replication connections). Names no value.
pub fn problem(text: &str) -> Option<String> {
    let text = text.trim();
    if uri_prefix_len(text).is_some() {
        return None;
    }
    let (pairs, stopped) = pairs(text);
    if let Some(why) = stopped {
        return Some(format!("{why} after {} keyword(s)", pairs.len()));
    }
    for (key, value) in &pairs {
        if !KEYWORDS.contains(&key.as_str()) {
            let shown =
                if key.len() <= 32 && key.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                    format!("\"{key}\"")
                } else {
                    "(not shown)".into()
                };
            return Some(format!("invalid connection option {shown}"));
        }
        if key == "port"
            && !value
                .split(',')
                .all(|p| p.is_empty() || p.parse::<u16>().is_ok())
        {
            return Some("invalid port number".into());
        }
        if key == "dbname" && (value.contains('=') || uri_prefix_len(value.trim_start()).is_some())
        {
            if let Some(p) = problem(value) {
                return Some(p);
            }
        }
    }
    None
}

/// `postgresql://[user[:password]@][hosts][/dbname][?keyword=value&...]`.
fn secret_in_uri(text: &str) -> Option<&'static str> {
    let rest = &text[uri_prefix_len(text)?..];
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    if let Some(at) = authority.find('@') {
        if authority[..at].contains(':') {
            return Some("password");
        }
    }
    let query = rest.find('?').map(|q| &rest[q + 1..])?;
    query.split('&').find_map(|pair| {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let key = percent_decode(key);
        secret_keyword(&key).or_else(|| nested_secret(&key, &percent_decode(value)))
    })
}

/// `%XX` escapes decoded (bad escapes kept as written).
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&hi), Some(&lo)) if hex(hi).is_some() && hex(lo).is_some() => {
                out.push((hex(hi).unwrap_or(0) * 16 + hex(lo).unwrap_or(0)) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// One host of a connection string with several (`host=a,b port=1,2`):
/// the values that make a connection to that host alone. `None`: the
/// keyword was not given (libpq's default applies).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostChoice {
    pub host: Option<String>,
    pub hostaddr: Option<String>,
    pub port: Option<String>,
}

/// The hosts of a connection string, in order, from its `host`, `hostaddr`
/// and `port` values as libpq parsed them: one entry per host, as libpq
/// tries them (a single `port` applies to every host). Fewer than two
/// hosts, or lists libpq would refuse (counts that differ), give an empty
/// list: the connection string is used as it is.
pub fn hosts(host: Option<&str>, hostaddr: Option<&str>, port: Option<&str>) -> Vec<HostChoice> {
    let split = |v: Option<&str>| -> Vec<String> {
        v.filter(|v| !v.is_empty())
            .map(|v| v.split(',').map(|p| p.trim().to_string()).collect())
            .unwrap_or_default()
    };
    let (hosts, addrs, ports) = (split(host), split(hostaddr), split(port));
    let n = hosts.len().max(addrs.len());
    if n < 2
        || (!hosts.is_empty() && hosts.len() != n)
        || (!addrs.is_empty() && addrs.len() != n)
        || (ports.len() > 1 && ports.len() != n)
    {
        return Vec::new();
    }
    (0..n)
        .map(|i| HostChoice {
            host: hosts.get(i).cloned(),
            hostaddr: addrs.get(i).cloned(),
            port: if ports.len() == 1 {
                ports.first().cloned()
            } else {
                ports.get(i).cloned()
            },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{hosts, secret_in};

    #[test]
    fn problems_are_found_without_libpq() {
        use super::problem;
        assert_eq!(
            problem("host=h port=5432,5433 dbname=d passfile=/x sslmode=require"),
            None
        );
        assert!(problem("host=127.0.0.1 port=notaport").is_some());
        assert!(problem("host=h nosuch=1").is_some());
        assert!(problem("host=h 'unterminated").is_some());
        assert!(problem("host='h").is_some());
        assert_eq!(problem("postgresql://h/d"), None);
        assert!(problem("host=h secret")
            .unwrap_or_default()
            .find("secret")
            .is_none());
    }

    #[test]
    fn keyword_strings() {
        assert_eq!(secret_in("host=h port=5432 dbname=d user=u"), None);
        assert_eq!(secret_in("host=h password=s3cret"), Some("password"));
        assert_eq!(
            secret_in("host=h  password = 's3 cret' user=u"),
            Some("password")
        );
        assert_eq!(secret_in("password=''"), Some("password"));
        assert_eq!(secret_in("host=h PASSWORD=x"), Some("password"));
        assert_eq!(secret_in("host=h sslpassword=x"), Some("sslpassword"));
        assert_eq!(secret_in("host=h passfile=/etc/pgpass"), None);
        // A quoted value that looks like a keyword is not one.
        assert_eq!(secret_in("application_name='a password=x' host=h"), None);
        assert_eq!(secret_in(r"application_name=a\ password=x host=h"), None);
        assert_eq!(secret_in("dbname='host=h password=x'"), Some("password"));
        assert_eq!(secret_in("dbname=postgresql://u:x@h/d"), Some("password"));
        assert_eq!(secret_in("host=h password"), None); // libpq refuses it anyway
    }

    #[test]
    fn uris() {
        assert_eq!(secret_in("postgresql://u@h:5432/d"), None);
        assert_eq!(secret_in("postgresql://h/d?sslmode=require"), None);
        assert_eq!(secret_in("postgresql://u:pw@h/d"), Some("password"));
        assert_eq!(secret_in("postgres://u:@h/d"), Some("password"));
        assert_eq!(secret_in("POSTGRESQL://u:pw@h"), Some("password"));
        assert_eq!(secret_in("postgresql://u@h/d?password=x"), Some("password"));
        assert_eq!(
            secret_in("postgresql://h/d?a=1&pass%77ord=x"),
            Some("password")
        );
        assert_eq!(
            secret_in("postgresql://h/d?sslpassword=x"),
            Some("sslpassword")
        );
        assert_eq!(
            secret_in("postgresql://h1:5432,h2:5433/d?target_session_attrs=read-write"),
            None
        );
        assert_eq!(secret_in("postgresql:///d?host=/tmp&passfile=/p"), None);
        // ':' after the authority is not a password.
        assert_eq!(secret_in("postgresql://h/d?options=-c%20a:b@c"), None);
    }

    #[test]
    fn several_hosts_are_named_one_by_one_as_libpq_tries_them() {
        let h = hosts(Some("a,b"), None, Some("5432,5433"));
        assert_eq!(h.len(), 2);
        assert_eq!(h[1].host.as_deref(), Some("b"));
        assert_eq!(h[1].port.as_deref(), Some("5433"));
        assert_eq!(h[1].hostaddr, None);
        // One port for every host; hostaddr beside host.
        let h = hosts(Some("a,b"), Some("10.0.0.1,10.0.0.2"), Some("6432"));
        assert_eq!(h[0].port.as_deref(), Some("6432"));
        assert_eq!(h[1].port.as_deref(), Some("6432"));
        assert_eq!(h[1].hostaddr.as_deref(), Some("10.0.0.2"));
        // One host, or lists libpq refuses: used as they are.
        assert!(hosts(Some("a"), None, Some("1")).is_empty());
        assert!(hosts(None, None, None).is_empty());
        assert!(hosts(Some("a,b"), Some("x"), None).is_empty());
        assert!(hosts(Some("a,b,c"), None, Some("1,2")).is_empty());
    }
}
