package kvdir

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"

	"github.com/twosided/twosided/notify/directory"
)

// CAFileEnv names a PEM file of the certificate authorities that sign the metadata
// service's certificate (rediss://, https://); without it the system's roots are used.
const CAFileEnv = "TWOSIDED_METADATA_CA_FILE"

// TLSConfig is the client TLS configuration for a service at host: the system's roots, or
// those of the file $TWOSIDED_METADATA_CA_FILE names.
func TLSConfig(host string, lookup func(string) (string, bool)) (*tls.Config, error) {
	c := &tls.Config{ServerName: host, MinVersion: tls.VersionTLS12}
	file, ok := lookup(CAFileEnv)
	if !ok || file == "" {
		return c, nil
	}
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", directory.ErrBadConn, CAFileEnv, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%w: %s: %s holds no PEM certificate", directory.ErrBadConn, CAFileEnv, file)
	}
	c.RootCAs = pool
	return c, nil
}
