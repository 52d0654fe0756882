package hamiaccounting

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
)

// Option changes how Dial connects.
type Option func(*dialConfig)

type dialConfig struct {
	tls      *tls.Config
	policies Policies
	extra    []grpc.DialOption
}

// WithTLS makes the connection TLS with config; without it the connection is
// plaintext. A daemon that runs mutual TLS (HAMI_ACCOUNTING_TLS_CA_FILE set)
// requires config.Certificates to hold a client certificate signed by its CA:
// LoadTLSConfig builds such a config from PEM files.
func WithTLS(config *tls.Config) Option {
	return func(c *dialConfig) { c.tls = config }
}

// WithPolicy replaces the call policy of one method (a full method name such
// as MethodCheckQuota) on this connection.
func WithPolicy(method string, policy CallPolicy) Option {
	return func(c *dialConfig) { c.policies = c.policies.With(method, policy) }
}

// WithDialOptions adds gRPC dial options, for example a service config with
// the round_robin balancer or an OpenTelemetry stats handler. They are
// applied after Dial's own, and their unary interceptors run inside the call
// policy (once per attempt).
func WithDialOptions(options ...grpc.DialOption) Option {
	return func(c *dialConfig) { c.extra = append(c.extra, options...) }
}

// reconnect retries a lost connection after 100 ms, growing to at most 2 s:
// gRPC's default backoff grows to 120 s, so a client that lost its daemon
// during a restart would fail fast with UNAVAILABLE for minutes after the
// daemon is back. The daemons use the same bounds between themselves.
var reconnect = grpc.ConnectParams{
	Backoff: backoff.Config{
		BaseDelay:  100 * time.Millisecond,
		Multiplier: 1.6,
		Jitter:     0.2,
		MaxDelay:   2 * time.Second,
	},
	MinConnectTimeout: 5 * time.Second,
}

// doc:begin dial
// Dial opens a connection to one hami-accounting daemon at target: host:port,
// or dns:///name:port to resolve every address of a headless Service. It does
// not wait for the daemon: one that is down surfaces as UNAVAILABLE on a call,
// which the call policy retries where that is safe. Plaintext unless WithTLS.
//
// Every unary call on the connection goes through the call policy of its
// method (DefaultPolicies, changed with WithPolicy): a deadline per attempt,
// and the retries Retryable allows. Streams (WatchUsage) are left as they are.
func Dial(ctx context.Context, target string, options ...Option) (*grpc.ClientConn, error) {
	config := dialConfig{policies: DefaultPolicies()}
	for _, option := range options {
		option(&config)
	}
	// grpc-go 1.33 (Debian 12) has no insecure.NewCredentials; WithInsecure is
	// deprecated in newer releases but kept throughout 1.x.
	transport := grpc.WithInsecure()
	if config.tls != nil {
		transport = grpc.WithTransportCredentials(credentials.NewTLS(config.tls))
	}
	dialOptions := append([]grpc.DialOption{
		transport,
		grpc.WithConnectParams(reconnect),
		grpc.WithChainUnaryInterceptor(config.policies.UnaryClientInterceptor()),
	}, config.extra...)
	return grpc.DialContext(ctx, target, dialOptions...)
}

// doc:end dial

// doc:begin tls
// LoadTLSConfig builds the client side of the daemons' TLS from PEM files, as
// their HAMI_ACCOUNTING_TLS_* variables name them: caFile verifies the
// daemon's certificate (the system roots when empty); certFile and keyFile,
// both or neither, are the client certificate a daemon running mutual TLS
// requires; serverName is the name the daemon's certificate must carry (empty:
// the host of the dialled target, e.g. hami-accounting-usage.hami-system.svc).
func LoadTLSConfig(certFile, keyFile, caFile, serverName string) (*tls.Config, error) {
	config := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName}
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("hamiaccounting: TLS: certFile and keyFile go together: " +
			"set both for a client certificate, or neither")
	}
	if certFile != "" {
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("hamiaccounting: TLS: certFile %q / keyFile %q: %w", certFile, keyFile, err)
		}
		config.Certificates = []tls.Certificate{pair}
	}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("hamiaccounting: TLS: caFile: %w", err)
		}
		roots := x509.NewCertPool()
		if !roots.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("hamiaccounting: TLS: caFile %q holds no PEM certificate", caFile)
		}
		config.RootCAs = roots
	}
	return config, nil
}

// doc:end tls
