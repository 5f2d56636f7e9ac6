package dtq

import "testing"

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
