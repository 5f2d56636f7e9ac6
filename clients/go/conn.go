package dtq

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io/ioutil"
	"strconv"
	"strings"
	"time"
	"unicode"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
)

// MaxMessageBytes is the receive limit of dtq connections (64 MiB, what the
// gateway accepts): above the default 1 MiB payload limit plus overhead.
const MaxMessageBytes = 64 << 20

// ConnConfig says how to reach a gateway.
type ConnConfig struct {
	// Target is the gateway address (default 127.0.0.1:50051): host:port, a grpc
	// URI ending in a port (dns:///host:port, ipv4:addr:port, ipv6:[addr]:port), or a
	// unix:, unix-abstract: or vsock: address. Dial refuses any other (CheckTarget).
	Target string
	// Token, when set, is sent as "authorization: Bearer <token>" on every call.
	Token string
	// TLS enables TLS; CAFile is the CA bundle (PEM) that verifies the gateway
	// ("" = the system roots). CertFile and KeyFile give a client certificate (mTLS).
	TLS      bool
	CAFile   string
	CertFile string
	KeyFile  string
	// MaxBackoff caps the channel's reconnect backoff (default 5 s), so that a
	// worker comes back within about that long after its gateway serves again.
	MaxBackoff time.Duration
}

type bearer struct {
	token  string
	secure bool
}

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.token}, nil
}

func (b bearer) RequireTransportSecurity() bool { return b.secure }

// Dial opens one gRPC channel to the gateway with the protocol's keepalive
// (a PING every 10 s, closed when its ack is 5 s late, also without calls), a
// reconnect backoff of 100 ms up to MaxBackoff, and the 64 MiB receive limit.
//
// Errors: a Target that CheckTarget refuses (the error names ConnConfig.Target), a CA
// or key file that cannot be read or parsed.
func Dial(cfg ConnConfig) (*grpc.ClientConn, error) {
	target := cfg.Target
	if target == "" {
		target = "127.0.0.1:50051"
	}
	if err := CheckTarget(target, "ConnConfig.Target"); err != nil {
		return nil, err
	}
	maxBackoff := cfg.MaxBackoff
	if maxBackoff <= 0 {
		maxBackoff = 5 * time.Second
	}
	opts := []grpc.DialOption{
		grpc.WithKeepaliveParams(keepalive.ClientParameters{
			Time: 10 * time.Second, Timeout: 5 * time.Second, PermitWithoutStream: true}),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6,
				Jitter: 0.2, MaxDelay: maxBackoff},
			MinConnectTimeout: 5 * time.Second}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMessageBytes)),
	}
	if cfg.TLS {
		tlsCfg, err := tlsConfig(cfg)
		if err != nil {
			return nil, err
		}
		opts = append(opts, grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)))
	} else {
		opts = append(opts, grpc.WithInsecure())
	}
	if cfg.Token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(bearer{cfg.Token, cfg.TLS}))
	}
	return grpc.Dial(target, opts...)
}

// pathSchemes are the grpc target schemes whose address is a path or an id, not
// HOST:PORT.
var pathSchemes = []string{"unix:", "unix-abstract:", "vsock:"}

// CheckTarget returns nil if target is a gateway address grpc reads as meant: host:port
// (or a grpc URI such as dns:///host:port or ipv4:addr:port) ending in a port of
// 1..65535, or a unix:, unix-abstract: or vsock: address; the Python and Node workers
// apply the same rule. grpc-go itself sends a target without a port to 443 (or fails
// later with an error that names no field).
//
// Errors: naming field: target empty, containing whitespace, or without a valid port
// at its end.
func CheckTarget(target, field string) error {
	if target == "" || strings.IndexFunc(target, unicode.IsSpace) >= 0 {
		return fmt.Errorf("dtq: %s: %q is not a gateway address (HOST:PORT)", field, target)
	}
	for _, scheme := range pathSchemes {
		if strings.HasPrefix(target, scheme) {
			return nil
		}
	}
	i := strings.LastIndexByte(target, ':')
	port := target[i+1:]
	if i < 0 || !validPort(port) {
		return fmt.Errorf("dtq: %s: %q is not HOST:PORT with a port of 1..65535", field, target)
	}
	return nil
}

// validPort reports whether port is 1 to 5 ASCII digits naming 1..65535.
func validPort(port string) bool {
	if port == "" || len(port) > 5 || strings.Trim(port, "0123456789") != "" {
		return false
	}
	n, err := strconv.Atoi(port)
	return err == nil && n >= 1 && n <= 65535
}

func tlsConfig(cfg ConnConfig) (*tls.Config, error) {
	out := &tls.Config{MinVersion: tls.VersionTLS12}
	if cfg.CAFile != "" {
		pem, err := ioutil.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("dtq: read CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("dtq: no certificate in CA file %s", cfg.CAFile)
		}
		out.RootCAs = pool
	}
	if cfg.CertFile != "" {
		pair, err := tls.LoadX509KeyPair(cfg.CertFile, cfg.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("dtq: load client certificate: %w", err)
		}
		out.Certificates = []tls.Certificate{pair}
	}
	return out, nil
}
