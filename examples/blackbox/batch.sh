#!/usr/bin/env bash
# A batch in bash + curl: any language can be drilled. Against TOOLKIT_PROVIDER_URL, for
# each PDF in TOOLKIT_INPUTS: key = SHA-256 of the content; the key is written to
# <name>.key before the submit (the intent); a rerun that finds a key looks it up
# before sending anything; a download goes to a temp file, is checked against the
# job's SHA-256 and only then renamed into TOOLKIT_OUT. Exit 1 leaves work for a rerun.
set -u
url="$TOOLKIT_PROVIDER_URL"; out="$TOOLKIT_OUT"; mkdir -p "$out" state
field() { sed -n "s/.*\"$1\": \"\\{0,1\\}\\([^,\"}]*\\)\"\\{0,1\\}.*/\\1/p" | head -n1; }
pending=0
for pdf in "$TOOLKIT_INPUTS"/*.pdf; do
  name=$(basename "$pdf" .pdf); dest="$out/$name.fr.pdf"
  [ -e "state/$name.done" ] && continue
  sha=$(sha256sum "$pdf" | cut -d' ' -f1); key="$sha:1"
  job=""
  if [ -e "state/$name.key" ]; then                  # an earlier run may have submitted it
    job=$(curl -sf --max-time 10 "$url/lookup?key=$key") || { pending=1; continue; }
    if echo "$job" | grep -q '"job": null'; then
      echo "$name: not found at the provider; parked for review" >&2
      touch "state/$name.done"; continue
    fi
  else
    echo "$key" > "state/$name.key.tmp" && sync "state/$name.key.tmp" && mv "state/$name.key.tmp" "state/$name.key"
    digest=$(printf "$(echo "$sha" | sed 's/../\\x&/g')" | base64)
    job=$(curl -s --max-time 10 -X POST "$url/jobs?options=%7B%22target%22%3A%22fr%22%7D" \
          -H "Idempotency-Key: $key" -H "Content-Digest: sha-256=:$digest:" --data-binary @"$pdf")
    if [ -z "$job" ] || echo "$job" | grep -q '"error": "transient"'; then
      job=$(curl -sf --max-time 10 "$url/lookup?key=$key") || { pending=1; continue; }
      echo "$job" | grep -q '"job": null' && { rm -f "state/$name.key"; pending=1; continue; }
    fi
  fi
  id=$(echo "$job" | field job_id); status=$(echo "$job" | field status)
  while [ "$status" = queued ] || [ "$status" = running ]; do
    job=$(curl -sf --max-time 10 "$url/jobs/$id") || break; status=$(echo "$job" | field status)
  done
  [ "$status" = succeeded ] || { [ "$status" = failed ] && touch "state/$name.done"; pending=1; continue; }
  want=$(echo "$job" | field artifact_sha256)
  curl -sf --max-time 30 -o "$dest.part" "$url/jobs/$id/artifact" || { rm -f "$dest.part"; pending=1; continue; }
  if [ "$(sha256sum "$dest.part" | cut -d' ' -f1)" = "$want" ]; then
    mv "$dest.part" "$dest"; touch "state/$name.done"
  else
    rm -f "$dest.part"; pending=1
  fi
done
exit $pending
