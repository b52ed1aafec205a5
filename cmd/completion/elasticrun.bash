# bash completion for elasticrun, elasticrun sweep and elasticrund (installed as
# /usr/share/bash-completion/completions/elasticrun and .../elasticrund, the latter a
# link to this file). The options come from the programs' own --help, so they cannot
# drift from it; the values of options that take a fixed set are listed here.

_elasticrun_values() {
  case "$1" in
    --launcher) COMPREPLY=($(compgen -W 'auto ssh srun' -- "$cur")) ;;
    --log-level) COMPREPLY=($(compgen -W 'error warn info debug' -- "$cur")) ;;
    --ssh-host-key-checking) COMPREPLY=($(compgen -W 'yes accept-new no' -- "$cur")) ;;
    --hostfile|--events|--ssh-identity-file|-i|--ssh-known-hosts|--ssh-config|--daemon-secret-file|\
    --secret-file|--host-discovery-script|--daemon-path) _filedir ;;
    --output-filename|--checkpoint-dir|--state-dir|--dir) _filedir -d ;;
    -x|--env) COMPREPLY=($(compgen -e -- "$cur")) ;;
    *) return 1 ;;
  esac
  return 0
}

_elasticrun() {
  local cur prev words cword split
  _init_completion -s || return
  local prog=$1 i sweep=
  # The command to run starts at the first word that is no option and no option's value:
  # from there, complete it as a command line of its own.
  for ((i = 1; i < cword; i++)); do
    case "${words[i]}" in
      sweep) [[ $prog == elasticrun && $i == 1 ]] && { sweep=1; continue; } ;;
      --) _command_offset $((i + 1)); return ;;
      -*) if [[ ${words[i]} != *=* ]] && _elasticrun_takes_value "${words[i]}"; then ((i++)); fi; continue ;;
    esac
    _command_offset "$i"
    return
  done
  _elasticrun_values "$prev" && return
  $split && return
  if [[ $cur == -* ]]; then
    local help
    if [[ -n $sweep ]]; then help=$("$prog" sweep --help 2>&1); else help=$("$prog" --help 2>&1); fi
    COMPREPLY=($(compgen -W "$(_parse_help - <<<"$help")" -- "$cur"))
    [[ ${COMPREPLY-} == *= ]] && compopt -o nospace
  elif [[ $prog == elasticrun && $cword == 1 ]]; then
    _command_offset 1
    [[ sweep == "$cur"* ]] && COMPREPLY+=(sweep)
  else
    _command_offset "$cword"
  fi
}

# Whether an option of ours takes a value (the next word): those --help shows with "arg".
_elasticrun_takes_value() {
  [[ -n ${_elasticrun_flags_with_values-} ]] ||
    _elasticrun_flags_with_values=" $("${words[0]}" --help 2>&1 |
      sed -n 's/^ *\(-[a-zA-Z] \[ \)\{0,1\}\(--[a-z-]*\)\( \]\)\{0,1\} arg.*/\2/p' | tr '\n' ' ')"
  [[ $_elasticrun_flags_with_values == *" $1 "* || $1 == -H || $1 == -x || $1 == -i || $1 == -p || $1 == -np ]]
}

complete -F _elasticrun elasticrun elasticrund
