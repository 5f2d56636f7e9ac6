package dtq

import (
	"strings"
	"testing"
)

// DTQ_TLS and DTQ_TLS_CA turn TLS on as in the Python and Node workers, so a manifest
// with DTQ_TLS=true never sends DTQ_TOKEN over a plaintext connection.
func TestConfigFromEnvTLSConvention(t *testing.T) {
	cases := []struct {
		tls, ca string
		want    bool
	}{
		{"", "", false}, {"0", "", false}, {"false", "", false}, {"off", "", false},
		{"1", "", true}, {"true", "", true}, {"TRUE", "", true}, {" yes ", "", true},
		{"on", "", true}, {"", "/etc/dtq/ca.pem", true},
	}
	for _, c := range cases {
		t.Setenv("DTQ_TLS", c.tls)
		t.Setenv("DTQ_TLS_CA", c.ca)
		cfg, err := ConfigFromEnv()
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Conn.TLS != c.want {
			t.Errorf("DTQ_TLS=%q DTQ_TLS_CA=%q: TLS = %v, want %v", c.tls, c.ca, cfg.Conn.TLS, c.want)
		}
		if cfg.Conn.CAFile != c.ca {
			t.Errorf("DTQ_TLS_CA=%q: CAFile = %q", c.ca, cfg.Conn.CAFile)
		}
	}
}

// A gateway address is checked as the Python worker's check_target does, for the forms
// the vendored grpc-go 1.33 can dial (resolvers dns and passthrough, the unix dialer): a
// port of 1..65535 at its end (grpc-go would dial 443 without one), an IPv6 host in
// brackets, or a unix: path; the error names the field that held it.
func TestConfigFromEnvGatewayAddress(t *testing.T) {
	good := []string{"127.0.0.1:50051", "gateway:1", "gw.example.com:65535",
		"[::1]:50051", "[fe80::1%eth0]:50051", "dns:///gateway:50051", "dns:///[::1]:50051",
		"dns://10.0.0.53/gateway:50051", "passthrough:///gateway:50051",
		"unix:/run/dtq.sock", "unix:dtq.sock", "unix:///run/dtq.sock"}
	bad := []string{"gateway", "gateway:", "gateway:0", "gateway:65536", "gateway:88697",
		"gateway:050051", "gateway:5005a", "gateway:+80", "dns:///gateway", "gate way:1",
		"gateway:\u0665\u0660",
		// a bare IPv6 address: grpc-go reads what follows the last ':' as the port
		"::1", "fe80::1", "2001:db8::1", "::1:50051", "dns:///::1", "dns:///::1:50051",
		"[gateway]:1", "[::1:50051", ":50051",
		// schemes grpc-go 1.33 has no resolver or dialer for: it dials them as host:port
		"ipv4:10.0.0.1:443", "ipv6:[::1]:50051", "unix-abstract:dtq", "vsock:3:50051",
		"http://gateway:50051", "https://gateway:443", "dns:gateway:50051", "dns://gateway:1",
		"unix:", "unix://", "unix:///", "unix://dtq.sock"}
	for _, target := range good {
		if err := CheckTarget(target, "f"); err != nil {
			t.Errorf("CheckTarget(%q) = %v, want nil", target, err)
		}
		t.Setenv("DTQ_GATEWAY", " "+target+" ")
		if cfg, err := ConfigFromEnv(); err != nil || cfg.Conn.Target != target {
			t.Errorf("DTQ_GATEWAY=%q: Target %q, err %v", target, cfg.Conn.Target, err)
		}
	}
	for _, target := range bad {
		t.Setenv("DTQ_GATEWAY", target)
		if _, err := ConfigFromEnv(); err == nil || !strings.Contains(err.Error(), "DTQ_GATEWAY: ") {
			t.Errorf("DTQ_GATEWAY=%q: err %v, want one naming DTQ_GATEWAY", target, err)
		}
		conn, err := Dial(ConnConfig{Target: target})
		if err == nil {
			conn.Close()
		}
		if err == nil || !strings.Contains(err.Error(), "ConnConfig.Target: ") {
			t.Errorf("Dial(Target %q): err %v, want one naming ConnConfig.Target", target, err)
		}
	}
	t.Setenv("DTQ_GATEWAY", "")
	if cfg, err := ConfigFromEnv(); err != nil || cfg.Conn.Target != "" {
		t.Errorf("DTQ_GATEWAY unset: Target %q, err %v (want the default)", cfg.Conn.Target, err)
	}
}
