package verbs

// The check of a libibverbs file before dlopen. It is pure Go, built with and without the
// rdma tag, so that its tests run without cgo: dlopen maps a shared object's load segments
// as its headers describe them, and touching a page past the end of a truncated file kills
// the process with SIGBUS inside the dynamic loader, long before dlerror could say a word.

import (
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// libSymbol is one entry point the provider resolves with dlvsym: its name and the symbol
// version rdma-core exports it under. An optional one may be missing.
type libSymbol struct {
	Name     string
	Version  string
	Optional bool
}

// checkLibraryFile says why the shared object at path must not be handed to dlopen as
// libibverbs, or nil. It requires an ELF shared object whose program headers, load segments
// and section headers all lie inside the file (a copy cut short is refused here instead of
// crashing the process in dlopen), and a dynamic symbol table that defines each required
// symbol of need at its version: a library built without rdma-core's symbol versions would
// satisfy dlvsym with whatever it exports under that name.
func checkLibraryFile(path string, need []libSymbol) error {
	fd, err := os.Open(path)
	if err != nil {
		return err
	}
	defer fd.Close()
	st, err := fd.Stat()
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("not a regular file (%s)", st.Mode().Type())
	}
	size := uint64(st.Size())
	var magic [len(elf.ELFMAG)]byte
	if _, err := fd.ReadAt(magic[:], 0); err != nil || string(magic[:]) != elf.ELFMAG {
		return fmt.Errorf("not an ELF file (%d bytes, no ELF magic number)", size)
	}
	f, err := elf.NewFile(fd)
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("its ELF headers run past the file's end (%d bytes): a truncated copy?", size)
	}
	if err != nil {
		return fmt.Errorf("a damaged ELF file: %v", err)
	}
	if f.Type != elf.ET_DYN {
		return fmt.Errorf("an ELF file of type %s, not a shared object (ET_DYN)", f.Type)
	}
	cut := func(what string, off, n uint64) error {
		end := off + n
		if end < off || end > size {
			return fmt.Errorf("%s ends past the file's end (byte %d of %d): a truncated copy?", what, uint64(end), size)
		}
		return nil
	}
	loads, dynamic := 0, false
	for i, p := range f.Progs {
		switch p.Type {
		case elf.PT_LOAD:
			loads++
			if p.Filesz > p.Memsz {
				return fmt.Errorf("load segment %d has more file bytes (%d) than memory bytes (%d)", i, p.Filesz, p.Memsz)
			}
		case elf.PT_DYNAMIC:
			dynamic = true
		}
		if err := cut(fmt.Sprintf("program header %d (%s)", i, p.Type), p.Off, p.Filesz); err != nil {
			return err
		}
	}
	if loads == 0 || !dynamic {
		return errors.New("no load segment or no dynamic section: not a shared library")
	}
	for _, s := range f.Sections {
		if s.Type == elf.SHT_NOBITS || s.Type == elf.SHT_NULL {
			continue
		}
		if err := cut(fmt.Sprintf("section %q", s.Name), s.Offset, s.FileSize); err != nil {
			return err
		}
	}
	syms, err := f.DynamicSymbols()
	if err != nil {
		return fmt.Errorf("no readable dynamic symbol table: %v", err)
	}
	versions := make(map[string][]string) // defined symbol -> the versions it is defined under
	for _, s := range syms {
		if s.Section != elf.SHN_UNDEF && (strings.HasPrefix(s.Name, "ibv_") || strings.HasPrefix(s.Name, "_ibv_")) {
			versions[s.Name] = append(versions[s.Name], s.Version)
		}
	}
	for _, n := range need {
		vs, ok := versions[n.Name]
		if !ok {
			if n.Optional {
				continue
			}
			return fmt.Errorf("has no %s@%s, which the verbs provider needs (not rdma-core's libibverbs, or one too old)", n.Name, n.Version)
		}
		found := false
		for _, v := range vs {
			found = found || v == n.Version
		}
		if !found && !n.Optional {
			return fmt.Errorf("exports %s without rdma-core's symbol version %s (has %q): not rdma-core's libibverbs",
				n.Name, n.Version, vs)
		}
	}
	return nil
}

// libraryFile is the file dlopen would open for name, when this can be known without
// dlopen: name itself when it holds a slash, else the first LD_LIBRARY_PATH directory that
// has it (ld.so splits the list at ':' and ';'; an empty entry is the working directory).
// "" means dlopen's own search goes on to the ld.so cache and the system directories.
func libraryFile(name, ldLibraryPath string) string {
	if strings.Contains(name, "/") {
		return name
	}
	if ldLibraryPath == "" {
		return ""
	}
	for _, dir := range strings.Split(strings.ReplaceAll(ldLibraryPath, ";", ":"), ":") {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p
		}
	}
	return ""
}
