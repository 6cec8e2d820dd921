//! `kiln accounts`: the operator's account commands over the admin API.

use reqwest::Method;
use serde_json::{Value, json};

use super::admin::{AdminClient, AdminTarget};

/// `kiln accounts …`.
#[derive(Debug, clap::Args)]
pub struct AccountsArgs {
    #[command(flatten)]
    pub target: AdminTarget,
    #[command(subcommand)]
    pub command: AccountsCommand,
}

/// An account command.
#[derive(Debug, clap::Subcommand)]
pub enum AccountsCommand {
    /// Create an account and print its API key (shown this once only).
    Create {
        name: String,
        /// Starting balance.
        #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
        credits: i64,
        /// Tier name [default: default].
        #[arg(long)]
        tier: Option<String>,
    },
    /// List the accounts.
    List,
    /// Add N credits (negative: take them) to an account.
    Credit {
        name: String,
        #[arg(allow_negative_numbers = true)]
        amount: i64,
    },
    /// Set an account's subscription.
    Subscription { name: String, state: SubscriptionState },
    /// Disable an account: its keys are refused from now on.
    Disable { name: String },
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum SubscriptionState {
    Active,
    Inactive,
}

fn row(a: &Value) -> String {
    format!(
        "{:<24} {:<37} {:>12} {:<12} {:<12} {}",
        a["name"].as_str().unwrap_or(""),
        a["id"].as_str().unwrap_or(""),
        a["credits"],
        a["tier"].as_str().unwrap_or(""),
        a["subscription"].as_str().unwrap_or(""),
        if a["disabled"] == true { "disabled" } else { "enabled" }
    )
}

const HEADER: &str = "NAME                     ID                                         CREDITS TIER         SUBSCRIPTION STATE";

/// Runs an account command; returns the exit code.
pub async fn run(config: crate::config::Config, args: AccountsArgs) -> anyhow::Result<i32> {
    let client = AdminClient::new(&args.target, &config)?;
    let path = |name: &str, action: &str| format!("/accounts/{name}{action}");
    let account = match args.command {
        AccountsCommand::Create { name, credits, tier } => {
            let created = client.call(Method::POST, "/accounts", Some(json!({ "name": name, "credits": credits, "tier": tier }))).await?;
            println!("{HEADER}\n{}", row(&created["account"]));
            println!("key: {}", created["key"].as_str().unwrap_or(""));
            eprintln!("(the key is shown only now; keep it)");
            return Ok(0);
        }
        AccountsCommand::List => {
            let all = client.call(Method::GET, "/accounts", None).await?;
            println!("{HEADER}");
            for a in all["accounts"].as_array().into_iter().flatten() {
                println!("{}", row(a));
            }
            return Ok(0);
        }
        AccountsCommand::Credit { name, amount } => client.call(Method::POST, &path(&name, "/credits"), Some(json!({ "amount": amount }))).await?,
        AccountsCommand::Subscription { name, state } => {
            client.call(Method::POST, &path(&name, "/subscription"), Some(json!({ "active": matches!(state, SubscriptionState::Active) }))).await?
        }
        AccountsCommand::Disable { name } => client.call(Method::POST, &path(&name, "/disable"), None).await?,
    };
    println!("{HEADER}\n{}", row(&account));
    Ok(0)
}
