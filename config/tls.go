package config

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// The TLS of [server] (tls_cert_file, tls_key_file, tls_client_ca), read
// from its files when the server starts.

// ClientCAPool reads tls_client_ca: the pool client certificates are
// checked against, nil when none is configured. Errors: the file does not
// read or holds no PEM certificate.
func (s *Server) ClientCAPool() (*x509.CertPool, error) {
	path := s.TLSClientCA
	if path == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read tls_client_ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("tls_client_ca %s holds no PEM certificate", path)
	}
	return pool, nil
}

// ListenerTLS is the listener's TLS: the server's certificate and, with
// tls_client_ca, client certificates verified when a client offers one
// (fleet workers); clients without one still connect and use tokens.
// Errors: a file does not load.
func (s *Server) ListenerTLS() (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(s.TLSCertFile, s.TLSKeyFile)
	if err != nil {
		return nil, fmt.Errorf("load TLS certificate: %w", err)
	}
	c := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	pool, err := s.ClientCAPool()
	if err != nil {
		return nil, err
	}
	if pool != nil {
		c.ClientCAs, c.ClientAuth = pool, tls.VerifyClientCertIfGiven
	}
	return c, nil
}

// ReplicaTLS is how a follower checks the leader's certificate ([ha]):
// the system's roots and the certificates of tls_cert_file (replicas
// sharing a certificate, or its CA's chain). Nil without HTTPS. Errors:
// tls_cert_file does not read.
func (s *Server) ReplicaTLS() (*tls.Config, error) {
	if s.TLSCertFile == "" {
		return nil, nil
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	pem, err := os.ReadFile(s.TLSCertFile)
	if err != nil {
		return nil, fmt.Errorf("read tls_cert_file: %w", err)
	}
	pool.AppendCertsFromPEM(pem)
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}
