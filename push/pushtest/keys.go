package pushtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"testing"
)

// The service account NewServiceAccount writes. Every account it makes has
// the same project and email, so that two of them differ only in their key:
// the fake trusts the first and refuses the other, which is how a test
// presents a wrong key.
const (
	ServiceAccountProject = "pushtest-project"
	ServiceAccountEmail   = "relay@pushtest-project.iam.gserviceaccount.com"
)

// NewAPNsKey generates an APNs auth key: a P-256 key in a PKCS#8 "PRIVATE
// KEY" PEM block, which is what a .p8 file from Apple holds.
func NewAPNsKey(t testing.TB) (p8PEM []byte, priv *ecdsa.PrivateKey) {
	t.Helper()
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("pushtest: %v", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		t.Fatalf("pushtest: %v", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), priv
}

// NewServiceAccount generates a Google service-account key file, shaped
// like the one the Firebase console downloads, whose token_uri is tokenURL
// (a FakeGoogle's TokenURL). It returns the JSON, the RSA key inside it and
// the account's email.
func NewServiceAccount(t testing.TB, tokenURL string) (jsonBytes []byte, priv *rsa.PrivateKey, email string) {
	t.Helper()
	priv, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatalf("pushtest: %v", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		t.Fatalf("pushtest: %v", err)
	}
	account := map[string]string{
		"type":                        "service_account",
		"project_id":                  ServiceAccountProject,
		"private_key_id":              randomHex(20),
		"private_key":                 string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})),
		"client_email":                ServiceAccountEmail,
		"client_id":                   "100000000000000000001",
		"auth_uri":                    "https://accounts.google.com/o/oauth2/auth",
		"token_uri":                   tokenURL,
		"auth_provider_x509_cert_url": "https://www.googleapis.com/oauth2/v1/certs",
		"client_x509_cert_url":        "https://www.googleapis.com/robot/v1/metadata/x509/relay%40pushtest-project.iam.gserviceaccount.com",
		"universe_domain":             "googleapis.com",
	}
	jsonBytes, err = json.MarshalIndent(account, "", "  ")
	if err != nil {
		t.Fatalf("pushtest: %v", err)
	}
	return jsonBytes, priv, ServiceAccountEmail
}
