package sqldrivers

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The root package's tests that take lib/pq when it is linked in.
const rootTests = "^(TestPostgresDatabaseSQL|TestDatabaseSQLThroughPgBouncer|TestDatabaseSQLRetryableConnectErrors)$"

// TestLibPQ runs the root package's database/sql tests with lib/pq linked
// in and checks that they ran with it: the conformance suite, and the
// PgBouncer transaction-mode case (which skips without pgbouncer, except
// under CI=true), and pgsqlstore.Retryable on lib/pq's failures to connect.
func TestLibPQ(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	version := pqVersion(t)
	tmp := t.TempDir()

	rootMod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	mod := string(rootMod) + "\nrequire github.com/lib/pq " + version + "\n"
	write(t, filepath.Join(tmp, "go.mod"), mod)
	rootSum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	ownSum, err := os.ReadFile("go.sum")
	if err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(tmp, "go.sum"), string(rootSum)+string(ownSum))
	write(t, filepath.Join(tmp, "libpq_test.go"),
		"package txlimit_test\n\nimport _ \"github.com/lib/pq\" // registers \"postgres\": see internal/sqldrivers\n")
	overlay, err := json.Marshal(map[string]map[string]string{
		"Replace": {filepath.Join(root, "zz_libpq_test.go"): filepath.Join(tmp, "libpq_test.go")},
	})
	if err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(tmp, "overlay.json"), string(overlay))

	cmd := exec.Command("go", "test", "-count=1", "-v",
		"-modfile="+filepath.Join(tmp, "go.mod"), "-overlay="+filepath.Join(tmp, "overlay.json"),
		"-run", rootTests, ".")
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go test in the root with lib/pq: %v\n%s", err, out)
	}
	// The suite ran with lib/pq: its topics passed under the "postgres"
	// driver's subtest.
	for _, variant := range []string{"libpq", "libpq_binary_parameters"} {
		for _, topic := range []string{"limits", "limit_all", "remaining", "reservations", "prune", "edges"} {
			want := "--- PASS: TestPostgresDatabaseSQL/" + variant + "/" + topic
			if !strings.Contains(string(out), want) {
				t.Errorf("no %q in the output:\n%s", want, out)
			}
		}
	}
	for _, c := range []string{"WrongRole", "Refused", "NoSuchDatabase", "NoSuchRole"} {
		want := "--- PASS: TestDatabaseSQLRetryableConnectErrors/postgres/" + c
		if !strings.Contains(string(out), want) {
			t.Errorf("no %q in the output:\n%s", want, out)
		}
	}
	if !regexp.MustCompile(`--- (PASS|SKIP): TestDatabaseSQLThroughPgBouncer`).Match(out) {
		t.Errorf("TestDatabaseSQLThroughPgBouncer did not run:\n%s", out)
	}
	if regexp.MustCompile(`--- PASS: TestDatabaseSQLThroughPgBouncer`).Match(out) &&
		!strings.Contains(string(out), "--- PASS: TestDatabaseSQLThroughPgBouncer/libpq/tx=true/shards=4") {
		t.Errorf("the PgBouncer case did not run with lib/pq:\n%s", out)
	}
	t.Logf("%s", out)
}

// pqVersion is the lib/pq version this module's go.mod requires.
func pqVersion(t *testing.T) string {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Version}}", "github.com/lib/pq").Output()
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(out))
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
