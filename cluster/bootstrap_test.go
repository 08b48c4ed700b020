package cluster

import (
	"strings"
	"testing"
)

func TestInstallLine(t *testing.T) {
	tok := Token{MeshID: "m1", CADigest: strings.Repeat("ab", 32), Secret: "s3cret"}.String()
	line, err := InstallLine("10.0.0.1", tok, "/usr/local/bin/mesh")
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{
		"sh -ec '", "curl -fsSk https://10.0.0.1:7430/v1/ca",
		`echo "` + strings.Repeat("ab", 32) + `  $d/ca.der" | sha256sum -c --quiet`,
		"sh -ec 'IFS= read -r t; ",
		`printf "Authorization: Bearer %s\n" "$t" > "$d/auth"; `,
		`curl -fsS --cacert "$d/ca.pem" -H @"$d/auth" https://10.0.0.1:7430/v1/binary`,
		`install -m 0755 "$d/mesh" /usr/local/bin/mesh`,
		`printf "%s\n" "$t" | /usr/local/bin/mesh join 10.0.0.1 --token-file -'`,
	} {
		if !strings.Contains(line, w) {
			t.Errorf("install line lacks %q:\n%s", w, line)
		}
	}
	// The token goes in on standard input, from a printf of the pasting
	// shell: never in the script, which ps shows every user while it runs.
	if !strings.HasPrefix(line, "printf '%s\\n' '"+tok+"' | sh -ec '") || strings.Count(line, tok) != 1 {
		t.Fatalf("the token is not only in the printf:\n%s", line)
	}
	// The digest is checked before the binary is fetched.
	if strings.Index(line, "sha256sum -c") > strings.Index(line, "/v1/binary") {
		t.Fatal("the binary is fetched before the CA is checked")
	}
	if l, _ := InstallLine("10.0.0.1:7431", tok, "/x/mesh"); !strings.Contains(l, "https://10.0.0.1:7431/v1/binary") {
		t.Fatalf("port: %s", l)
	}
	if _, err := InstallLine("10.0.0.1", "not-a-token", "/x"); err == nil {
		t.Fatal("a bad token gave a line")
	}
}
