package hamiaccounting

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
)

// pki is a throwaway CA, a daemon certificate for 127.0.0.1 and a client
// certificate it signed, written as PEM files like the daemons' Secret.
type pki struct {
	caFile, serverCert, serverKey, clientCert, clientKey string
	roots                                                *x509.CertPool
}

func newPKI(t *testing.T) pki {
	t.Helper()
	dir := t.TempDir()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTemplate := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTemplate, caTemplate, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, kind string, der []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	leaf := func(name string, serial int64, usage x509.ExtKeyUsage, ips []net.IP) (string, string) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		template := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: ips,
		}
		der, err := x509.CreateCertificate(rand.Reader, template, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		keyDER, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		return write(name+".crt", "CERTIFICATE", der), write(name+".key", "EC PRIVATE KEY", keyDER)
	}
	p := pki{caFile: write("ca.crt", "CERTIFICATE", caDER), roots: x509.NewCertPool()}
	p.roots.AddCert(ca)
	p.serverCert, p.serverKey = leaf("usage", 2, x509.ExtKeyUsageServerAuth, []net.IP{net.ParseIP("127.0.0.1")})
	p.clientCert, p.clientKey = leaf("hami-scheduler", 3, x509.ExtKeyUsageClientAuth, nil)
	return p
}

// mutualTLS is what a daemon with HAMI_ACCOUNTING_TLS_CA_FILE set serves: its
// certificate, and a client certificate signed by the CA is required.
func (p pki) mutualTLS(t *testing.T) grpc.ServerOption {
	pair, err := tls.LoadX509KeyPair(p.serverCert, p.serverKey)
	if err != nil {
		t.Fatal(err)
	}
	return grpc.Creds(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{pair}, ClientCAs: p.roots, ClientAuth: tls.RequireAndVerifyClientCert,
	}))
}

func TestDialSpeaksTheDaemonsTLS(t *testing.T) {
	p := newPKI(t)
	withClientCert, err := LoadTLSConfig(p.clientCert, p.clientKey, p.caFile, "")
	if err != nil {
		t.Fatal(err)
	}
	withoutClientCert, err := LoadTLSConfig("", "", p.caFile, "")
	if err != nil {
		t.Fatal(err)
	}
	wrongName, err := LoadTLSConfig(p.clientCert, p.clientKey, p.caFile, "hami-accounting-usage.hami-system.svc")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		options []Option
		code    codes.Code
	}{
		{"mutual TLS with a client certificate the CA signed", []Option{WithTLS(withClientCert)}, codes.OK},
		{"TLS without a client certificate is refused", []Option{WithTLS(withoutClientCert)}, codes.Unavailable},
		{"a server name the certificate does not carry is refused", []Option{WithTLS(wrongName)}, codes.Unavailable},
		{"plaintext to a TLS daemon is refused", nil, codes.Unavailable},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fakes := serveFakes(t, &script{}, p.mutualTLS(t))
			// One attempt: the refusal itself is what is checked, not the retries.
			options := append(tc.options, WithPolicy(MethodCheckQuota, CallPolicy{Timeout: 5 * time.Second, Attempts: 1}))
			_, err := fakes.client(t, options...).CheckQuota(context.Background(), []byte(`{"metadata":{"uid":"u"}}`))
			if got := status.Code(err); got != tc.code {
				t.Fatalf("ended %v (%v), want %v", got, err, tc.code)
			}
			reached := len(fakes.script.arrivals())
			if (tc.code == codes.OK) != (reached == 1) {
				t.Fatalf("%d calls reached the daemon", reached)
			}
		})
	}
}

func TestPlaintextDialsAPlaintextDaemon(t *testing.T) {
	fakes := serveFakes(t, &script{})
	if _, err := fakes.client(t).CheckQuota(context.Background(), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
}

func TestLoadTLSConfigNamesWhatIsWrong(t *testing.T) {
	p := newPKI(t)
	junk := filepath.Join(t.TempDir(), "junk.pem")
	if err := os.WriteFile(junk, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name                      string
		cert, key, ca, serverName string
		message                   string
	}{
		{"a certificate without its key", p.clientCert, "", p.caFile, "", "certFile and keyFile go together"},
		{"a key without its certificate", "", p.clientKey, p.caFile, "", "certFile and keyFile go together"},
		{"a certificate with another's key", p.clientCert, p.serverKey, p.caFile, "", "certFile"},
		{"a CA file that is missing", "", "", filepath.Join(t.TempDir(), "none.crt"), "", "caFile"},
		{"a CA file with no certificate in it", "", "", junk, "", "holds no PEM certificate"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LoadTLSConfig(tc.cert, tc.key, tc.ca, tc.serverName)
			if err == nil || !strings.Contains(err.Error(), tc.message) {
				t.Fatalf("got %v, want an error naming %q", err, tc.message)
			}
		})
	}
	config, err := LoadTLSConfig(p.clientCert, p.clientKey, p.caFile, "hami-accounting-usage.hami-system.svc")
	if err != nil {
		t.Fatal(err)
	}
	if len(config.Certificates) != 1 || config.RootCAs == nil || config.ServerName != "hami-accounting-usage.hami-system.svc" ||
		config.MinVersion != tls.VersionTLS12 {
		t.Fatalf("config %+v: want one client certificate, the CA, the server name and TLS 1.2 at least", config)
	}
}
