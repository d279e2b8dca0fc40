//! `stress --plot FILE`: where the plot goes, checked before the run and written after it.
//!
//! A path that cannot take the plot is refused before the run, so it costs no run: a FIFO
//! (opening one for writing waits for a reader), a directory, the `--trace` file itself, or a
//! directory where no file can be created. What is checked is a file the plot is written
//! into: a hidden temporary beside `FILE`, created before the run. When the run ends with a
//! report, the plot is written there and renamed onto `FILE` — so until then an existing
//! `FILE` (or whatever a symbolic link named `FILE` points at) keeps its bytes, whether the
//! run is refused, fails or is interrupted. A run that does not get that far removes the
//! temporary.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The plot's destination, with its temporary file open for writing.
#[derive(Debug)]
pub struct PlotFile {
    path: PathBuf,
    temp: PathBuf,
    file: Option<File>,
}

impl PlotFile {
    /// Checks `path` and creates its temporary file. `trace`: the `--trace` file, if any,
    /// which the plot must not replace. `Err` is a one-line message naming `--plot`.
    pub fn prepare(path: &Path, trace: Option<&Path>) -> Result<PlotFile, String> {
        let shown = path.display();
        if let Ok(m) = std::fs::metadata(path) {
            if is_fifo(&m) {
                return Err(format!(
                    "--plot: {shown} is a FIFO (opening it would wait for a reader): give a file"
                ));
            }
            if m.is_dir() {
                return Err(format!("--plot: {shown} is a directory: give a file"));
            }
            if trace.is_some_and(|t| same_file(&m, t)) {
                return Err(format!(
                    "--plot: {shown} is the --trace file (the plot would replace it): give another file"
                ));
            }
        }
        let Some(name) = path.file_name() else {
            return Err(format!("--plot: {shown} names no file: give a file"));
        };
        let mut temp_name = std::ffi::OsString::from(".");
        temp_name.push(name);
        temp_name.push(format!(".kvsched-{}.tmp", std::process::id()));
        let temp = path.with_file_name(temp_name);
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&temp)
            .map_err(|e| format!("--plot: cannot create {shown}: {e}"))?;
        Ok(PlotFile {
            path: path.to_path_buf(),
            temp,
            file: Some(file),
        })
    }

    /// The path the plot goes to, as given.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `svg` and puts it in place of the file at [`path`](Self::path).
    pub fn commit(mut self, svg: &str) -> std::io::Result<()> {
        let Some(mut file) = self.file.take() else {
            return Ok(());
        };
        file.write_all(svg.as_bytes())?;
        file.flush()?;
        drop(file);
        std::fs::rename(&self.temp, &self.path)
    }
}

impl Drop for PlotFile {
    /// Removes the temporary file of a plot never put in place (the run failed, or its write
    /// did).
    fn drop(&mut self) {
        // After a successful `commit` the temporary is gone: nothing to remove.
        let _ = std::fs::remove_file(&self.temp);
    }
}

/// Whether `a` (a file's metadata) and the file at `b` are one file.
#[cfg(unix)]
fn same_file(a: &std::fs::Metadata, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(b).is_ok_and(|b| (a.dev(), a.ino()) == (b.dev(), b.ino()))
}

/// Whether `a` and the file at `b` are one file (by path, where there are no inode numbers).
#[cfg(not(unix))]
fn same_file(_: &std::fs::Metadata, b: &Path) -> bool {
    let _ = b;
    false
}

/// Whether `m` is a FIFO's.
#[cfg(unix)]
fn is_fifo(m: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::FileTypeExt;
    m.file_type().is_fifo()
}

/// Whether `m` is a FIFO's (none elsewhere).
#[cfg(not(unix))]
fn is_fifo(_: &std::fs::Metadata) -> bool {
    false
}
