//! The `plugin:` sink: a shared library with the C ABI of examples/plugin/fanin_sink.h
//! (`fanin_init`, `fanin_tf`, `fanin_cleanup`), given pointers into the build buffer.
//!
//! The library runs inside the EPN: a plug-in that crashes takes the EPN with it.

use std::ffi::{c_char, c_int, CString};
use std::path::Path;

use anyhow::Context;
use fanin_proto::Reason;
use libloading::{Library, Symbol};

use super::{Sink, SinkCtx, SinkError, TfView};

#[repr(C)]
struct CStf {
    flp_id: u32,
    reserved: u32,
    len: u64,
    data: *const u8,
}

#[repr(C)]
struct CTf {
    run_id: u64,
    tf_id: u64,
    epn_id: u32,
    n_stfs: u32,
    bytes: u64,
    stfs: *const CStf,
}

type InitFn = unsafe extern "C" fn(c_int, *const *const c_char) -> c_int;
type TfFn = unsafe extern "C" fn(*const CTf) -> c_int;
type CleanupFn = unsafe extern "C" fn();

pub struct PluginSink {
    name: String,
    lib: Library,
    tf: TfFn,
    stfs: Vec<CStf>,
    cleaned: bool,
    /// `fanin_init`'s argv: the library may keep the pointers until `fanin_cleanup`.
    _argv: (Vec<CString>, Vec<*const c_char>),
}

// SAFETY: the library's functions are called from the one sink thread only, as the
// header promises plug-in authors; the raw pointers in `stfs` are rebuilt per TF.
unsafe impl Send for PluginSink {}

impl PluginSink {
    pub fn load(path: &Path, args: &[String], _ctx: &SinkCtx) -> anyhow::Result<PluginSink> {
        let name = path.display().to_string();
        // SAFETY: loading a library runs its initialisers: the user chose to trust it.
        let lib = unsafe { Library::new(path) }.with_context(|| format!("plugin {name}"))?;
        // SAFETY: the symbols' types are the header's; a library that declares them
        // otherwise breaks its contract.
        let (init, tf) = unsafe {
            let init: Symbol<InitFn> = symbol(&lib, b"fanin_init\0", &name)?;
            let tf: Symbol<TfFn> = symbol(&lib, b"fanin_tf\0", &name)?;
            symbol::<CleanupFn>(&lib, b"fanin_cleanup\0", &name)?;
            (*init, *tf)
        };
        let argv: Vec<CString> = std::iter::once(name.clone())
            .chain(args.iter().cloned())
            .map(|a| {
                CString::new(a)
                    .map_err(|_| anyhow::anyhow!("plugin {name}: an argument holds a NUL byte"))
            })
            .collect::<anyhow::Result<_>>()?;
        let ptrs: Vec<*const c_char> = argv.iter().map(|a| a.as_ptr()).collect();
        // SAFETY: argv lives as long as the library; the pointers are NUL-terminated.
        let rc = unsafe { init(ptrs.len() as c_int, ptrs.as_ptr()) };
        anyhow::ensure!(rc == 0, "plugin {name}: fanin_init returned {rc}");
        Ok(PluginSink {
            name,
            lib,
            tf,
            stfs: Vec::new(),
            cleaned: false,
            _argv: (argv, ptrs),
        })
    }
}

/// # Safety
/// `T` must be the symbol's real type.
unsafe fn symbol<'l, T>(lib: &'l Library, sym: &[u8], name: &str) -> anyhow::Result<Symbol<'l, T>> {
    let what = String::from_utf8_lossy(&sym[..sym.len() - 1]).into_owned();
    lib.get(sym)
        .with_context(|| format!("plugin {name}: no symbol {what} (see fanin_sink.h)"))
}

impl Sink for PluginSink {
    fn accept(&mut self, tf: &TfView) -> Result<(), SinkError> {
        self.stfs.clear();
        self.stfs.extend(tf.stfs.iter().map(|(flp, p)| CStf {
            flp_id: *flp,
            reserved: 0,
            len: p.len() as u64,
            data: p.as_ptr(),
        }));
        let c = CTf {
            run_id: tf.run_id,
            tf_id: tf.tf,
            epn_id: tf.epn,
            n_stfs: self.stfs.len() as u32,
            bytes: tf.bytes,
            stfs: self.stfs.as_ptr(),
        };
        // SAFETY: every pointer in `c` points into buffers that outlive the call.
        let rc = unsafe { (self.tf)(&c) };
        match rc {
            0 => Ok(()),
            rc => Err(SinkError {
                reason: Reason::SinkRefused,
                msg: format!("plugin {}: fanin_tf returned {rc}", self.name),
                fatal: false,
            }),
        }
    }

    fn finish(&mut self) -> anyhow::Result<()> {
        if !std::mem::replace(&mut self.cleaned, true) {
            // SAFETY: the symbol was checked at load; called once.
            unsafe {
                let f: Symbol<CleanupFn> = self.lib.get(b"fanin_cleanup\0")?;
                f();
            }
        }
        Ok(())
    }
}
