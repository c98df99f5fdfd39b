// Command ferretdb runs FerretDB v1 (a MongoDB wire-protocol server on SQLite or PostgreSQL) through its
// embeddable package, so that a build from the Go module proxy needs none of its generated version files.
// It is test infrastructure for faultline, not product code.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/FerretDB/FerretDB/ferretdb"
)

func main() {
	listen := flag.String("listen-addr", "127.0.0.1:27017", "TCP address to listen on")
	sqlite := flag.String("sqlite-url", "file:data/", "SQLite URI of an existing directory")
	postgres := flag.String("postgresql-url", "", "PostgreSQL URL (postgres://host:port/db); when set, used instead of SQLite")
	level := flag.String("log-level", "warn", "debug, info, warn or error")
	version := flag.Bool("version", false, "print the FerretDB version and exit")
	flag.Parse()
	if *version {
		fmt.Println("ferretdb (embedded) v1.24.2")
		return
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(*level)); err != nil {
		fmt.Fprintln(os.Stderr, "bad -log-level:", err)
		os.Exit(2)
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
	config := &ferretdb.Config{
		Listener:  ferretdb.ListenerConfig{TCP: *listen},
		Logger:    logger,
		Handler:   "sqlite",
		SQLiteURL: *sqlite,
	}
	if *postgres != "" {
		config.Handler = "postgresql"
		config.PostgreSQLURL = *postgres
		config.SQLiteURL = ""
	}
	f, err := ferretdb.New(config)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ferretdb:", err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fmt.Fprintln(os.Stderr, "ferretdb: listening on", *listen)
	if err := f.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "ferretdb:", err)
		os.Exit(1)
	}
}
