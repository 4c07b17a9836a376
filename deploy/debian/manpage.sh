#!/bin/sh
# manpage.sh BINARY SECTION SUMMARY [SUBCOMMAND...]: prints a man page for
# BINARY generated from its --help (and `BINARY SUBCOMMAND -h` for each
# SUBCOMMAND), so the page always lists the options of that very build.
# The date is SOURCE_DATE_EPOCH's, for reproducible packages. Used by
# build.sh (make deb).
set -eu
bin=${1:?usage: manpage.sh BINARY SECTION SUMMARY [SUBCOMMAND...]}
section=${2:?section}
summary=${3:?summary}
shift 3
name=$(basename "$bin")
date=$(date -u -d "@${SOURCE_DATE_EPOCH:-$(date +%s)}" +%Y-%m-%d)
version=$("$(dirname "$bin")/bypassd" --version 2>/dev/null | cut -d' ' -f1,2 || echo bypassd)

# roff: a backslash is \e, a minus \-, and a line may not start with . or '.
esc() { sed -e 's/\\/\\e/g' -e 's/-/\\-/g' -e "s/^\\([.']\\)/\\\\\\&\\1/"; }

upper=$(echo "$name" | tr 'a-z-' 'A-Z_')
printf '.TH %s %s "%s" "%s" "bypassd"\n' "$upper" "$section" "$date" "$version"
printf '.SH NAME\n%s \\- %s\n' "$(echo "$name" | esc)" "$(echo "$summary" | esc)"
printf '.SH DESCRIPTION\nThe options as %s \\-\\-help prints them.\n.PP\n.nf\n' "$(echo "$name" | esc)"
"$bin" --help 2>&1 | esc
printf '.fi\n'
for sub in "$@"; do
	printf '.SS %s\n.nf\n' "$(echo "$name $sub" | esc)"
	"$bin" "$sub" -h 2>&1 | esc
	printf '.fi\n'
done
printf '.SH SEE ALSO\n'
printf 'bypassd(8), bypassctl(1), bypass\\-stats(1), bypass\\-perf(1);\n'
printf '/usr/share/doc/bypassd/configuration.md (every option, environment variable and default),\n'
printf '/usr/share/doc/bypassd/operations.md (running, privileges, upgrades).\n'
