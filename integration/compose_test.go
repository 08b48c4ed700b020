package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Issue 15: a compose file of two services, where one reaches the other by
// its short compose name through an expose:d port, with a named volume and
// a bind mount: imported, added, assigned to two nodes, running.
const bedCompose = `name: bedproj
services:
  bedcweb:
    image: localhost/mesh-bed-busybox:1
    command: ["httpd", "-f", "-p", "18083", "-h", "/www"]
    expose: ["18083"]
    volumes:
      - ./site:/www:ro
  bedcclient:
    image: localhost/mesh-bed-busybox:1
    command: ["sh", "-c", "while true; do wget -q -O /data/page.tmp http://bedcweb:18083/ && mv /data/page.tmp /data/page; sleep 1; done"]
    depends_on: [bedcweb]
    volumes:
      - pages:/data
volumes:
  pages: {}
`

func TestComposeImportBed(t *testing.T) {
	n, _ := startThree(t)
	dir := filepath.Join(n[1].h.dir, "compose")
	os.MkdirAll(filepath.Join(dir, "site"), 0o755)
	os.WriteFile(filepath.Join(dir, "compose.yaml"), []byte(bedCompose), 0o644)
	os.WriteFile(filepath.Join(dir, "site", "index.html"), []byte("from-compose"), 0o644)
	root := filepath.Join(n[1].h.dir, "srv")
	out := n[1].run("import", "compose", filepath.Join(dir, "compose.yaml"), "--output", filepath.Join(dir, "mesh"), "--root", root)
	for _, want := range []string{
		"bedcclient: named volume pages -> directory " + root + "/bedproj-bedcclient/pages",
		"bedcweb: expose 18083 -> published at 18083 on the node, where the name bedcweb answers",
		"bedcweb: bind mount of the directory " + dir + "/site -> directory " + root + "/bedproj-bedcweb/site",
		"wrote 2 manifests for project bedproj",
	} {
		if !strings.Contains(out, want) {
			t.Fatalf("import output lacks %q:\n%s", want, out)
		}
	}
	n[1].run("check", filepath.Join(dir, "mesh", "bedcweb.yaml"), filepath.Join(dir, "mesh", "bedcclient.yaml"))
	n[1].mesh("module", "add", filepath.Join(dir, "mesh", "bedcweb.yaml"), filepath.Join(dir, "mesh", "bedcclient.yaml"))
	n[1].mesh("assign", "n2", "bedcweb", "--wait")
	// The bind mount became a declared directory; its contents are the
	// operator's to copy (the import said so).
	site := filepath.Join(root, "bedproj-bedcweb", "site")
	if st, err := os.Stat(site); err != nil || !st.IsDir() {
		t.Fatalf("the bind mount's directory was not made: %v", err)
	}
	os.WriteFile(filepath.Join(site, "index.html"), []byte("from-compose"), 0o644)
	n[1].mesh("assign", "n1", "bedcclient", "--wait")
	if out := n[1].resolve("bedcweb.internal"); !strings.Contains(out, n[2].addr()) {
		t.Fatalf("bedcweb.internal: %s", out)
	}
	page := filepath.Join(root, "bedproj-bedcclient", "pages", "page")
	eventually(t, 30*time.Second, "bedcclient on n1 fetched bedcweb's page on n2 by its short compose name", func() (bool, string) {
		b, err := os.ReadFile(page)
		return err == nil && string(b) == "from-compose", string(b) + errString(err)
	})
	if st, err := os.Stat(filepath.Dir(page)); err != nil || st.Mode().Perm() != 0o750 {
		t.Fatalf("the named volume's directory: %v %v", st, err)
	}
}
