// gelo-tlog: the small client side of GELO's release log. The log itself is Tessera's POSIX
// log (github.com/transparency-dev/tessera, its posix-oneshot command appends entries);
// this tool makes the log's key, and reads the log's tiles to write the proofs a verifier
// checks: an inclusion proof of one entry under the latest signed checkpoint and, when
// asked, a consistency proof from an earlier tree size (RFC 9162 section 2.1).
//
//	gelo-tlog keygen -name NAME -out DIR
//	gelo-tlog prove -log DIR -pub FILE -entry FILE [-from SIZE] -out FILE
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/transparency-dev/formats/log"
	"github.com/transparency-dev/tessera/client"
	"golang.org/x/mod/sumdb/note"
)

func main() {
	if len(os.Args) < 2 {
		fail(fmt.Errorf("usage: gelo-tlog keygen|prove ..."))
	}
	var err error
	switch os.Args[1] {
	case "keygen":
		err = keygen(os.Args[2:])
	case "prove":
		err = prove(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "gelo-tlog:", err)
	os.Exit(1)
}

func keygen(args []string) error {
	fs := flag.NewFlagSet("keygen", flag.ExitOnError)
	name := fs.String("name", "", "the log's origin (its key name)")
	out := fs.String("out", "", "folder for log.key (private) and log.pub")
	_ = fs.Parse(args)
	if *name == "" || *out == "" {
		return fmt.Errorf("keygen needs -name and -out")
	}
	skey, vkey, err := note.GenerateKey(rand.Reader, *name)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(*out, 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(*out, "log.key"), []byte(skey), 0o600); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(*out, "log.pub"), []byte(vkey+"\n"), 0o644)
}

// Proof is what a GELO verifier reads (services/edge/attest/src/release/).
type Proof struct {
	Checkpoint  string       `json:"checkpoint"`
	Index       uint64       `json:"index"`
	Inclusion   [][]byte     `json:"inclusion"`
	Consistency *Consistency `json:"consistency,omitempty"`
}

// Consistency proves that the tree of size From is a prefix of the checkpoint's tree.
type Consistency struct {
	From  uint64   `json:"from"`
	Proof [][]byte `json:"proof"`
}

func prove(args []string) error {
	fs := flag.NewFlagSet("prove", flag.ExitOnError)
	dir := fs.String("log", "", "the POSIX log's folder")
	pub := fs.String("pub", "", "the log's public key (note verifier key)")
	entry := fs.String("entry", "", "the entry to prove, byte for byte")
	from := fs.Uint64("from", 0, "also prove consistency from this earlier tree size")
	out := fs.String("out", "", "where to write the proof (JSON)")
	_ = fs.Parse(args)
	if *dir == "" || *pub == "" || *entry == "" || *out == "" {
		return fmt.Errorf("prove needs -log, -pub, -entry and -out")
	}
	ctx := context.Background()
	vkey, err := os.ReadFile(*pub)
	if err != nil {
		return err
	}
	verifier, err := note.NewVerifier(string(bytes.TrimSpace(vkey)))
	if err != nil {
		return err
	}
	want, err := os.ReadFile(*entry)
	if err != nil {
		return err
	}
	f := client.FileFetcher{Root: *dir}
	cp, raw, _, err := client.FetchCheckpoint(ctx, f.ReadCheckpoint, verifier, verifier.Name())
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	index, err := find(ctx, f, cp, want)
	if err != nil {
		return err
	}
	pb, err := client.NewProofBuilder(ctx, cp.Size, f.ReadTile)
	if err != nil {
		return err
	}
	p := Proof{Checkpoint: string(raw), Index: index}
	if p.Inclusion, err = pb.InclusionProof(ctx, index); err != nil {
		return err
	}
	if *from > 0 {
		if *from > cp.Size {
			return fmt.Errorf("-from %d is past the checkpoint's size %d", *from, cp.Size)
		}
		c := Consistency{From: *from}
		if c.Proof, err = pb.ConsistencyProof(ctx, *from, cp.Size); err != nil {
			return err
		}
		p.Consistency = &c
	}
	text, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(*out, append(text, '\n'), 0o644)
}

// find returns the index of the first entry equal to want.
func find(ctx context.Context, f client.FileFetcher, cp *log.Checkpoint, want []byte) (uint64, error) {
	for i := uint64(0); i*256 < cp.Size; i++ {
		bundle, err := client.GetEntryBundle(ctx, f.ReadEntryBundle, i, cp.Size)
		if err != nil {
			return 0, err
		}
		for j, e := range bundle.Entries {
			if bytes.Equal(e, want) {
				return i*256 + uint64(j), nil
			}
		}
	}
	return 0, fmt.Errorf("the entry is not in the log (size %d)", cp.Size)
}
