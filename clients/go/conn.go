package dtq

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io/ioutil"
	"net"
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
	// Target is the gateway address (default 127.0.0.1:50051): host:port (an IPv6
	// host in brackets: [::1]:50051), dns:///host:port, passthrough:///host:port, or
	// unix:path / unix:///absolute-path. Dial refuses any other (CheckTarget).
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

// CheckTarget returns nil if target is a gateway address the vendored grpc-go (1.33,
// whose resolvers are dns and passthrough, and whose dialer also knows unix) dials as
// meant:
//
//   - host:port with a port of 1..65535, where host is a name or IPv4 address, or an
//     IPv6 address in brackets ([::1]:50051);
//   - the same after dns:/// or dns://authority/, or after passthrough:/// (or
//     passthrough://authority/);
//   - unix:path or unix:///absolute-path, with a non-empty path.
//
// The Python worker applies the same rule to these forms (and also takes ipv4:, ipv6:,
// unix-abstract: and vsock:, which grpc-go 1.33 cannot dial). grpc-go itself sends a
// target without a port to 443, splits a bare IPv6 address such as ::1 into host and
// port wrongly, and fails later, with an error that names no field, on any other form
// (ipv4:addr:port, http://host:port, a bare unix:).
//
// Errors: naming field: target empty, containing whitespace, without a valid port at
// its end, with a host that is empty or holds ':' outside brackets, with an unknown
// scheme, or a unix: address without a path.
func CheckTarget(target, field string) error {
	if target == "" || strings.IndexFunc(target, unicode.IsSpace) >= 0 {
		return fmt.Errorf("dtq: %s: %q is not a gateway address (HOST:PORT)", field, target)
	}
	address := target
	if i := strings.Index(target, "://"); i >= 0 {
		scheme, rest := target[:i], target[i+3:]
		slash := strings.IndexByte(rest, '/')
		switch {
		case scheme == "unix":
			if rest == "" || rest[0] != '/' || len(rest) == 1 {
				return fmt.Errorf("dtq: %s: %q has no path (unix:PATH, unix:///ABSOLUTE-PATH)",
					field, target)
			}
			return nil
		case scheme != "dns" && scheme != "passthrough":
			return fmt.Errorf("dtq: %s: %q has a scheme grpc-go cannot dial (use HOST:PORT or "+
				"dns:///HOST:PORT)", field, target)
		case slash < 0:
			return fmt.Errorf("dtq: %s: %q is not %s://[AUTHORITY]/HOST:PORT", field, target, scheme)
		}
		address = rest[slash+1:]
	} else if strings.HasPrefix(target, "unix:") {
		if target == "unix:" {
			return fmt.Errorf("dtq: %s: %q has no path (unix:PATH, unix:///ABSOLUTE-PATH)",
				field, target)
		}
		return nil
	}
	i := strings.LastIndexByte(address, ':')
	if i < 0 || !validPort(address[i+1:]) {
		return fmt.Errorf("dtq: %s: %q is not HOST:PORT with a port of 1..65535", field, target)
	}
	if !validHost(address[:i]) {
		return fmt.Errorf("dtq: %s: %q is not HOST:PORT with HOST a name or IP address (an "+
			"IPv6 address in brackets: [::1]:50051)", field, target)
	}
	return nil
}

// validHost reports whether host is an IPv6 address in brackets (a zone allowed:
// [fe80::1%eth0]) or a non-empty name or IPv4 address without ':', '[', ']' or '/'.
func validHost(host string) bool {
	if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
		addr := host[1 : len(host)-1]
		if zone := strings.IndexByte(addr, '%'); zone >= 0 {
			if zone == len(addr)-1 {
				return false
			}
			addr = addr[:zone]
		}
		ip := net.ParseIP(addr)
		return ip != nil && strings.Contains(addr, ":")
	}
	return host != "" && !strings.ContainsAny(host, ":[]/")
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
