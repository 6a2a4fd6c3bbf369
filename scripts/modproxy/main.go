// Command modproxy writes a module proxy directory (the GOPROXY protocol's
// file layout, usable as GOPROXY=file://DIR) from tags of a git repository:
// for each tag, the module's zip as the go command would make it from
// version control (golang.org/x/mod/zip: nested modules, vendor directories
// and files git does not track left out), its go.mod, an .info with the
// commit's time, and the version in @v/list. scripts/publishcheck.sh runs it
// on a temporary clone where it made test tags.
//
//	modproxy -repo DIR -out DIR TAG...
//
// A tag names its module as the go command reads tags: v0.1.0 is the module
// at the repository's root, cmd/txlimit/v0.1.0 the module in cmd/txlimit. It
// prints the go.sum lines of each module version it wrote.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
	"golang.org/x/mod/sumdb/dirhash"
	"golang.org/x/mod/zip"
)

func main() {
	repo := flag.String("repo", ".", "the git repository (a work tree) holding the tags")
	out := flag.String("out", "", "the proxy directory to write (created when missing)")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: modproxy -repo DIR -out DIR TAG...\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if *out == "" || flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	for _, tag := range flag.Args() {
		if err := write(*repo, *out, tag); err != nil {
			fmt.Fprintf(os.Stderr, "modproxy: %s: %v\n", tag, err)
			os.Exit(1)
		}
	}
}

// write adds the module version that tag names to the proxy directory out.
func write(repo, out, tag string) error {
	subdir, version := "", tag
	if i := strings.LastIndex(tag, "/"); i >= 0 {
		subdir, version = tag[:i], tag[i+1:]
	}
	if !semver.IsValid(version) || semver.Canonical(version) != version {
		return fmt.Errorf("%s is not a canonical semantic version", version)
	}
	gomod, err := git(repo, "show", tag+":"+path.Join(subdir, "go.mod"))
	if err != nil {
		return fmt.Errorf("no go.mod at the tag: %w", err)
	}
	modPath := modfile.ModulePath(gomod)
	if modPath == "" {
		return fmt.Errorf("%s/go.mod has no module line", subdir)
	}
	mv := module.Version{Path: modPath, Version: version}
	if err := module.Check(mv.Path, mv.Version); err != nil {
		return err
	}
	when, err := git(repo, "show", "-s", "--format=%cI", tag+"^{commit}")
	if err != nil {
		return err
	}
	t, err := time.Parse(time.RFC3339, strings.TrimSpace(string(when)))
	if err != nil {
		return err
	}

	escPath, err := module.EscapePath(mv.Path)
	if err != nil {
		return err
	}
	escVersion, err := module.EscapeVersion(mv.Version)
	if err != nil {
		return err
	}
	dir := filepath.Join(out, filepath.FromSlash(escPath), "@v")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	base := filepath.Join(dir, escVersion)

	zipFile := base + ".zip"
	f, err := os.Create(zipFile)
	if err != nil {
		return err
	}
	if err := zip.CreateFromVCS(f, mv, repo, tag, subdir); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.WriteFile(base+".mod", gomod, 0o644); err != nil {
		return err
	}
	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{mv.Version, t.UTC()})
	if err != nil {
		return err
	}
	if err := os.WriteFile(base+".info", info, 0o644); err != nil {
		return err
	}
	if err := addToList(filepath.Join(dir, "list"), mv.Version); err != nil {
		return err
	}

	zipHash, err := dirhash.HashZip(zipFile, dirhash.Hash1)
	if err != nil {
		return err
	}
	modHash, err := dirhash.Hash1([]string{"go.mod"}, func(string) (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(gomod)), nil
	})
	if err != nil {
		return err
	}
	st, err := os.Stat(zipFile)
	if err != nil {
		return err
	}
	fmt.Printf("%s %s %s\n%s %s/go.mod %s\n", mv.Path, mv.Version, zipHash, mv.Path, mv.Version, modHash)
	fmt.Fprintf(os.Stderr, "modproxy: %s@%s from tag %s: %d bytes zipped\n", mv.Path, mv.Version, tag, st.Size())
	return nil
}

// addToList adds version to the proxy's list file of a module.
func addToList(list, version string) error {
	data, err := os.ReadFile(list)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	versions := strings.Fields(string(data))
	if !slices.Contains(versions, version) {
		versions = append(versions, version)
	}
	semver.Sort(versions)
	return os.WriteFile(list, []byte(strings.Join(versions, "\n")+"\n"), 0o644)
}

// git runs git in repo and returns its standard output.
func git(repo string, args ...string) ([]byte, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = repo
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("git %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return out, nil
}
