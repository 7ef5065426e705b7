// Package atomicfile replaces files so that a crash or power loss leaves
// either the old or the new content, never a partial or empty file, and
// never loses a replacement that was reported done: the content goes to a
// temporary file in the destination's directory, is fsynced, renamed over
// the destination (github.com/google/renameio/v2), and then the directory
// is fsynced so that the rename itself is on disk.
//
// It is semantics' own (semantics/logs, semantics/cas, semantics/objstore,
// semantics/trust), so that semantics/ imports nothing of the module's
// internal/ (internal/testkit/deptest); it is the one atomic writer of
// durable data. The agent's status file, rewritten every interval, uses
// renameio directly (no directory sync: a lost status is rewritten).
package atomicfile

import (
	"os"
	"path/filepath"

	"github.com/google/renameio/v2"
)

// WriteFile replaces path with data, with exactly the permission bits perm
// (the umask and an existing file's mode do not change them: a key written
// 0600 is 0600).
func WriteFile(path string, data []byte, perm os.FileMode) error {
	dir := filepath.Dir(path)
	t, err := renameio.NewPendingFile(path, renameio.WithTempDir(dir), renameio.WithStaticPermissions(perm))
	if err != nil {
		return err
	}
	defer t.Cleanup()
	if _, err := t.Write(data); err != nil {
		return err
	}
	if err := t.CloseAtomicallyReplace(); err != nil {
		return err
	}
	return SyncDir(dir)
}

// Rename renames src to dst and fsyncs the directories involved, so the
// rename survives a crash. The caller has fsynced src's content.
func Rename(src, dst string) error {
	if err := os.Rename(src, dst); err != nil {
		return err
	}
	if err := SyncDir(filepath.Dir(dst)); err != nil {
		return err
	}
	if sd := filepath.Dir(src); sd != filepath.Dir(dst) {
		return SyncDir(sd)
	}
	return nil
}

// SyncDir fsyncs a directory: the names created, renamed or removed in it
// are durable once it returns.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
