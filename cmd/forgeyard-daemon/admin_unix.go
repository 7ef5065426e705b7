package main

import (
	"net"
	"os"
	"path/filepath"
)

// listenUnixPrivate listens on a unix socket at path that is owner-only
// (0600) from the moment it appears there: the socket is bound inside a
// fresh 0700 directory beside path, chmod-ed, then renamed into place.
func listenUnixPrivate(path string) (net.Listener, error) {
	dir, err := os.MkdirTemp(filepath.Dir(path), ".admin-sock-*")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	tmp := filepath.Join(dir, "s")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, err
	}
	ln.SetUnlinkOnClose(false) // the server removes path itself at stop
	if err := os.Chmod(tmp, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	if err := os.Rename(tmp, path); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}
