package testcerts

import (
	"crypto/x509"
	"testing"
)

// Renewed makes another server certificate signed by s's CA, for the same
// addresses, called "assent test NAME" with a serial of its own, in new
// files NAME.pem and NAME-key.pem: what a renewal puts in place of
// ServerCertFile and ServerKey.
func (s *Set) Renewed(t testing.TB, name string) (certFile, keyFile string) {
	t.Helper()
	certFile, keyFile, _ = s.issue(t, name, x509.ExtKeyUsageServerAuth)
	return certFile, keyFile
}
