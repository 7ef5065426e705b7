// Package release holds the checks of what `make release` ships besides
// the binaries: the systemd units of packaging/systemd (systemd_test.go)
// and the CI workflows (workflows_test.go). The image builder is
// internal/tools/mkimage; the release script is .ci/release.sh.
package release
