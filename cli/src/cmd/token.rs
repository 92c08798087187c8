//! `neardup token new`: makes an API token and the entry of the server's tokens file that
//! lets it in (see `docs/security.md`). The server keeps only the entry: the token's
//! SHA-256, its role and a name.

use std::io::Write;
use std::path::PathBuf;

use neardup_server::access::{Role, Tokens, hex, sha256};
use serde_json::json;

use crate::error::CliError;

/// Options of `neardup token`.
#[derive(Debug, clap::Args)]
pub struct TokenArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: TokenCommand,
}

/// The `token` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum TokenCommand {
    /// Make a token: prints it once, with its entry for the tokens file (one JSON object).
    New {
        /// What it may do: read, write (read and write) or admin (everything).
        #[arg(long, value_parser = parse_role)]
        role: Role,
        /// A name for it (in the tokens file and the server's log; never secret).
        #[arg(long)]
        name: String,
        /// Append the entry to this tokens file (made if missing; a running server reads it
        /// again within 2 s, or at once on SIGHUP).
        #[arg(long)]
        append: Option<PathBuf>,
    },
}

/// Refuses a token name the tokens file cannot hold.
fn check_name(name: &str) -> Result<(), CliError> {
    if name.is_empty() || name.contains(['"', '\\', '\n']) {
        return Err(CliError::Config(format!(
            "token name {name:?}: give a non-empty name without quotes, backslashes or newlines"
        )));
    }
    Ok(())
}

/// Parses a role: read, write or admin.
pub fn parse_role(s: &str) -> Result<Role, String> {
    match s {
        "read" => Ok(Role::Read),
        "write" => Ok(Role::Write),
        "admin" => Ok(Role::Admin),
        _ => Err(format!("{s:?} is not a role: read, write or admin")),
    }
}

/// Runs `neardup token`.
pub fn run(args: TokenArgs) -> Result<(), CliError> {
    match args.command {
        TokenCommand::New { role, name, append } => {
            let (token, hash, entry) = new_token(&name, role)?;
            if let Some(path) = &append {
                append_entry(path, &entry)?;
            }
            let out = json!({
                "token": token,
                "name": name,
                "role": role.to_string(),
                "sha256": hash,
                "entry": entry,
                "appended_to": append.as_ref().map(|p| p.display().to_string()),
            });
            println!("{out}");
            Ok(())
        }
    }
}

/// A new token for `name` with `role`: the token, its SHA-256 (hex) and its tokens-file
/// entry; an error for a name the tokens file cannot hold.
pub fn new_token(name: &str, role: Role) -> Result<(String, String, String), CliError> {
    check_name(name)?;
    let mut secret = [0u8; 32];
    getrandom::fill(&mut secret)
        .map_err(|e| CliError::Config(format!("no random bytes for a token: {e}")))?;
    let token = format!("nd_{}", hex(&secret));
    let hash = hex(&sha256(token.as_bytes()));
    let entry = format!("[[token]]\nname = \"{name}\"\nrole = \"{role}\"\nsha256 = \"{hash}\"\n");
    Ok((token, hash, entry))
}

/// Appends `entry` to the tokens file at `path`, refusing a file that would no longer read.
pub fn append_entry(path: &PathBuf, entry: &str) -> Result<(), CliError> {
    let file_err = |action: &'static str| {
        move |source: std::io::Error| CliError::File {
            action,
            path: path.display().to_string(),
            source,
        }
    };
    let before = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(file_err("read")(e)),
    };
    let sep = if before.is_empty() || before.ends_with("\n\n") {
        ""
    } else if before.ends_with('\n') {
        "\n"
    } else {
        "\n\n"
    };
    let after = format!("{before}{sep}{entry}");
    Tokens::parse(&after)
        .map_err(|e| CliError::Config(format!("{}: {e}; nothing appended", path.display())))?;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(file_err("open"))?;
    f.write_all(format!("{sep}{entry}").as_bytes()).map_err(file_err("write"))?;
    f.sync_all().map_err(file_err("sync"))
}
