//! The run secret and what a node proves with it: HMAC-SHA256 over the listener's
//! challenge and the fields of its Register or DataHello, checked in constant time.

use std::path::Path;

use anyhow::Context;
use fanin_proto::{Nonce, Proof, Register, Role};
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The secret every node of a run shares (empty: none given, anyone can prove it).
#[derive(Clone, Default)]
pub struct Secret(Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secret({} bytes)", self.0.len())
    }
}

/// The environment variable `fanin run` passes each run's secret in (never argv, which
/// other users can read).
pub const SECRET_ENV: &str = "FANIN_SECRET";

impl Secret {
    pub fn new(bytes: impl Into<Vec<u8>>) -> Secret {
        Secret(bytes.into())
    }

    /// From `file` (trailing whitespace trimmed), else `$FANIN_SECRET`, else none.
    pub fn load(file: Option<&Path>) -> anyhow::Result<Secret> {
        Self::from_sources(file, std::env::var_os(SECRET_ENV))
    }

    /// `load` with the environment's value given: a file or a variable that holds only
    /// whitespace is refused (a secret that went missing, not a choice); an unset
    /// variable means no secret.
    fn from_sources(
        file: Option<&Path>,
        env: Option<std::ffi::OsString>,
    ) -> anyhow::Result<Secret> {
        if let Some(f) = file {
            let text =
                std::fs::read(f).with_context(|| format!("--secret-file {}", f.display()))?;
            let trimmed = text.trim_ascii_end();
            anyhow::ensure!(
                !trimmed.is_empty(),
                "--secret-file {}: the file is empty",
                f.display()
            );
            return Ok(Secret(trimmed.to_vec()));
        }
        let Some(env) = env else {
            return Ok(Secret(Vec::new()));
        };
        let text = env.into_encoded_bytes();
        let trimmed = text.trim_ascii_end();
        anyhow::ensure!(
            !trimmed.is_empty(),
            "{SECRET_ENV} is set but blank: unset it for a run without a secret"
        );
        Ok(Secret(trimmed.to_vec()))
    }

    /// A fresh random secret (32 bytes, as 64 hex digits) for one `fanin run`.
    pub fn generate() -> Secret {
        let bytes: [u8; 32] = rand::random();
        Secret(
            bytes
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
                .into_bytes(),
        )
    }

    /// As text, to hand to a child process in `FANIN_SECRET`.
    pub fn as_env(&self) -> String {
        String::from_utf8_lossy(&self.0).into_owned()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// A node without a secret says so, once per process, when it first joined a run
    /// (after any error of its start-up: those stay one line).
    pub fn warn_if_none(&self, role: Role) {
        static SAID: std::sync::Once = std::sync::Once::new();
        if !self.is_empty() {
            return;
        }
        let risk = match role {
            Role::Epn => "any process that reaches its data port can send it STFs",
            _ => "nothing proves its ICN and EPNs are the run's",
        };
        let who = role.name();
        SAID.call_once(|| {
            tracing::warn!("{who}: no run secret (--secret-file or FANIN_SECRET): {risk}")
        });
    }

    /// The run-control token (`Authorization: Bearer TOKEN` on the ICN's HTTP API):
    /// HMAC-SHA256(secret, "fanin/4 ctl") in hex; anyone holding the secret can make it.
    pub fn ctl_token(&self) -> String {
        let mut m = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key");
        m.update(b"fanin/4 ctl");
        let tag = m.finalize().into_bytes();
        tag.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Does this `Authorization` header carry the run-control token? Always, without a
    /// secret. Compared in constant time.
    pub fn allows_ctl(&self, authorization: Option<&str>) -> bool {
        if self.is_empty() {
            return true;
        }
        let given = authorization
            .and_then(|a| a.strip_prefix("Bearer "))
            .unwrap_or("")
            .trim();
        let want = self.ctl_token();
        given.len() == want.len()
            && given
                .bytes()
                .zip(want.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
    }

    fn mac(&self, domain: &[u8], nonce: &Nonce, fields: &[&[u8]]) -> Hmac<Sha256> {
        let mut m = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key");
        m.update(domain);
        m.update(nonce);
        for f in fields {
            m.update(&(f.len() as u32).to_le_bytes());
            m.update(f);
        }
        m
    }

    fn register_mac(&self, nonce: &Nonce, reg: &Register) -> Hmac<Sha256> {
        let id = reg.node_id.map(u64::from).unwrap_or(u64::MAX).to_le_bytes();
        let role = [reg.role as u8];
        self.mac(
            b"fanin/2 register",
            nonce,
            &[&role, &id, reg.data_addr.as_bytes()],
        )
    }

    fn data_mac(&self, nonce: &Nonce, run_id: u64, flp_id: u32) -> Hmac<Sha256> {
        let (run, flp) = (run_id.to_le_bytes(), flp_id.to_le_bytes());
        self.mac(b"fanin/2 data", nonce, &[&run, &flp])
    }

    /// The proof for a Register (its `proof` field is not covered).
    pub fn prove_register(&self, nonce: &Nonce, reg: &Register) -> Proof {
        self.register_mac(nonce, reg).finalize().into_bytes().into()
    }

    pub fn check_register(&self, nonce: &Nonce, reg: &Register) -> bool {
        self.register_mac(nonce, reg)
            .verify_slice(&reg.proof)
            .is_ok()
    }

    pub fn prove_data(&self, nonce: &Nonce, run_id: u64, flp_id: u32) -> Proof {
        self.data_mac(nonce, run_id, flp_id)
            .finalize()
            .into_bytes()
            .into()
    }

    pub fn check_data(&self, nonce: &Nonce, run_id: u64, flp_id: u32, proof: &Proof) -> bool {
        self.data_mac(nonce, run_id, flp_id)
            .verify_slice(proof)
            .is_ok()
    }
}

/// A fresh challenge.
pub fn nonce() -> Nonce {
    rand::random()
}

#[cfg(test)]
mod tests {
    use super::*;
    use fanin_proto::Role;

    fn reg(id: Option<u32>) -> Register {
        Register {
            role: Role::Epn,
            node_id: id,
            data_addr: "127.0.0.1:5555".into(),
            proof: [0; 32],
        }
    }

    #[test]
    fn a_proof_holds_for_its_secret_nonce_and_fields_only() {
        let (s, n) = (Secret::new("run secret"), nonce());
        let mut r = reg(Some(3));
        r.proof = s.prove_register(&n, &r);
        assert!(s.check_register(&n, &r));
        assert!(!Secret::new("other").check_register(&n, &r), "wrong secret");
        assert!(!Secret::default().check_register(&n, &r), "no secret");
        assert!(
            !s.check_register(&nonce(), &r),
            "replayed on another challenge"
        );
        let mut other_id = r.clone();
        other_id.node_id = Some(4);
        assert!(!s.check_register(&n, &other_id), "another id");
        let mut no_id = r.clone();
        no_id.node_id = None;
        assert!(!s.check_register(&n, &no_id), "id withdrawn");
        let p = s.prove_data(&n, 7, 1);
        assert!(s.check_data(&n, 7, 1, &p));
        assert!(!s.check_data(&n, 7, 2, &p) && !s.check_data(&n, 8, 1, &p));
        assert!(
            !s.check_data(&n, 7, 1, &r.proof),
            "a register proof is no data proof"
        );
    }

    #[test]
    fn a_blank_environment_secret_is_refused_and_an_unset_one_means_none() {
        let env = |v: &str| Some(std::ffi::OsString::from(v));
        assert_eq!(
            Secret::from_sources(None, env("s3cret \n")).unwrap().0,
            b"s3cret"
        );
        assert!(Secret::from_sources(None, None).unwrap().is_empty());
        for blank in ["", " ", "\n\t "] {
            let e = Secret::from_sources(None, env(blank))
                .unwrap_err()
                .to_string();
            assert!(e.contains("FANIN_SECRET is set but blank"), "{e}");
        }
    }

    #[test]
    fn a_secret_file_is_read_trimmed_and_an_empty_one_refused() {
        let dir = std::env::temp_dir().join(format!("fanin-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("secret");
        std::fs::write(&f, "s3cret\n").unwrap();
        let s = Secret::load(Some(&f)).unwrap();
        assert_eq!(s.as_env(), "s3cret");
        std::fs::write(&f, "\n").unwrap();
        let e = Secret::load(Some(&f)).unwrap_err();
        assert!(format!("{e:#}").contains("empty"), "{e:#}");
        let e = Secret::load(Some(&dir.join("none"))).unwrap_err();
        assert!(format!("{e:#}").contains("--secret-file"), "{e:#}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
