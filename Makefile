# Build and install slurm-htc from source, or build its packages.
#
#   make                 # optimized build of htc, htc-agent, htc-call and spank_htc.so (target/dist: the
#                        # `dist` profile, LTO; PROFILE=release for the quicker one without)
#   make man             # the man pages htc(1), htc-agent(8), spank_htc(8) -> target/man/
#   make install         # as root: binaries, the plugin, its plugstack.conf.d line, man pages
#   make uninstall
#   make deb             # target/packages/slurm-htc_VERSION-REV_ARCH.deb (DEB_REVISION=REV)
#   make rpm             # target/packages/slurm-htc-VERSION-REL.ARCH.rpm and the .src.rpm,
#                        # built offline from a source tarball with vendored crates (RPM_RELEASE=REL)
#   make dist            # only that source tarball (with the spec; `rpmbuild -ta` takes it)
#
# Override any of these, e.g. make install PREFIX=/opt/htc PLUGINDIR=/opt/slurm/lib/slurm
PREFIX       ?= /usr/local
BINDIR       ?= $(PREFIX)/bin
# Beside BINDIR, so that an install with only BINDIR moved (as the Slurm tests do) keeps its man
# pages out of the system's man path.
MANDIR       ?= $(patsubst %/,%,$(dir $(BINDIR)))/share/man
MULTIARCH    := $(shell gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
PLUGINDIR    ?= /usr/lib/$(MULTIARCH)/slurm-wlm
PLUGSTACKDIR ?= /etc/slurm/plugstack.conf.d
# Extra plugstack arguments, e.g. PLUGIN_ARGS="fanout=64"
PLUGIN_ARGS  ?=
DESTDIR      ?=
DEB_REVISION ?= 1
RPM_RELEASE  ?= 1

TARGET_DIR := $(or $(CARGO_TARGET_DIR),target)
PROFILE    ?= dist
TARGET     := $(TARGET_DIR)/$(PROFILE)
MAN_OUT    := $(TARGET_DIR)/man
# The plugin installed: this build's, or one built for another Slurm release's headers
# (SLURM_INCLUDE_DIR), e.g. tests/cluster/release-plugin.sh's.
PLUGIN_SO  ?= $(TARGET)/libspank_htc.so
PKG_OUT    ?= $(TARGET_DIR)/packages

.PHONY: all man install uninstall deb rpm dist test
# The plugin apart: its build-time tools (bindgen) would widen the features of the engine's
# (prost-build) and rebuild everything above it.
all:
	cargo build --profile $(PROFILE) --workspace --exclude spank-plugin --locked
	cargo build --profile $(PROFILE) -p spank-plugin --locked

# Generated from the clap definitions (node-agent/src/cli.rs) plus packaging/man/*.in.
man:
	cargo run --profile $(PROFILE) --locked -q -p htc-mangen -- $(MAN_OUT) >/dev/null

install: all man
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(PLUGINDIR) $(DESTDIR)$(PLUGSTACKDIR) \
		$(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(MANDIR)/man8
	install -m 0755 $(TARGET)/htc $(TARGET)/htc-agent $(TARGET)/htc-call $(DESTDIR)$(BINDIR)/
	install -m 0755 $(PLUGIN_SO) $(DESTDIR)$(PLUGINDIR)/spank_htc.so
	sed -e 's|@PLUGINDIR@|$(PLUGINDIR)|g' -e 's|@BINDIR@|$(BINDIR)|g' \
		-e 's|@PLUGIN_ARGS@|$(if $(PLUGIN_ARGS), $(PLUGIN_ARGS))|g' \
		packaging/htc.conf.in > $(DESTDIR)$(PLUGSTACKDIR)/htc.conf
	install -m 0644 $(MAN_OUT)/htc.1 $(DESTDIR)$(MANDIR)/man1/
	install -m 0644 $(MAN_OUT)/htc-agent.8 $(MAN_OUT)/spank_htc.8 $(DESTDIR)$(MANDIR)/man8/

uninstall:
	rm -f $(DESTDIR)$(BINDIR)/htc $(DESTDIR)$(BINDIR)/htc-agent $(DESTDIR)$(BINDIR)/htc-call $(DESTDIR)$(PLUGINDIR)/spank_htc.so \
		$(DESTDIR)$(PLUGSTACKDIR)/htc.conf $(DESTDIR)$(MANDIR)/man1/htc.1 \
		$(DESTDIR)$(MANDIR)/man8/htc-agent.8 $(DESTDIR)$(MANDIR)/man8/spank_htc.8

deb: all man
	BIN_DIR=$(TARGET) MAN_DIR=$(MAN_OUT) OUT_DIR=$(PKG_OUT) DEB_REVISION=$(DEB_REVISION) \
		packaging/build-deb.sh

rpm:
	OUT_DIR=$(PKG_OUT) RPM_RELEASE=$(RPM_RELEASE) packaging/build-rpm.sh

dist:
	OUT_DIR=$(PKG_OUT) RPM_RELEASE=$(RPM_RELEASE) packaging/build-rpm.sh --dist-only

test:
	tests/run-all.sh
