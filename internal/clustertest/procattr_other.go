//go:build !linux

package clustertest

import "os/exec"

// dieWithParent does nothing where the kernel cannot tie a child's life to
// its parent's; t.Cleanup still kills the replicas of a test that ends.
func dieWithParent(*exec.Cmd) {}
