{{/*
The rules of alerts/*.rules.yml, rendered with the prometheusRule values.

The rule files hold the defaults and stay valid rule files (promtool tests them as they
are). The chart parses each file and applies the edits below to the rules they name.
An edit is a text as it stands in one field of a rule (expr, summary or description),
in which {slot} marks a literal the chart owns: the text is found with any literal of
the slot's kind there, and written back with the slot's value for this release.
Whitespace in a text matches any whitespace and is kept as it is in the file, so is a
{window} (a range such as 5m). An edit that finds nothing fails the render: the rule
file and this table are out of step. With the default values every edit writes back
what the file holds (tests/unit/test_helm_chart.py checks both).
*/}}

{{/* Slot values as the rules spell them. Numbers print in Go's shortest form (0.95, 1e-05). */}}
{{- define "llm-gpu-exporter.ruleSlots" -}}
{{- $r := .Values.prometheusRule -}}
{{- $t := $r.thresholds -}}
{{- $s := $r.ttftSlo -}}
{{- $budget := round (subf 1.0 (float64 $s.objective)) 9 -}}
smActiveRatio: {{ float64 $t.smActiveRatio | toString | quote }}
clockThrottledRatio: {{ float64 $t.clockThrottledRatio | toString | quote }}
nvLinkErrors: {{ float64 $t.nvLinkErrors | toString | quote }}
oomRiskRatio: {{ float64 $t.oomRiskRatio | toString | quote }}
memoryFreeRatio: {{ float64 $t.memoryFreeRatio | toString | quote }}
kvCacheUsageRatio: {{ float64 $t.kvCacheUsageRatio | toString | quote }}
engineErrorRatio: {{ float64 $t.engineErrorRatio | toString | quote }}
engineErrorPercent: {{ round (mulf (float64 $t.engineErrorRatio) 100.0) 9 | toString | quote }}
collectorSampleAgeSeconds: {{ float64 $t.collectorSampleAgeSeconds | toString | quote }}
ttftBudget: {{ $budget | toString | quote }}
ttftBudgetPercent: {{ round (mulf $budget 100.0) 9 | toString | quote }}
ttftMs: {{ round (mulf (float64 $s.seconds) 1000.0) 9 | toString | quote }}
ttftBucketBelow: {{ $s.bucketBelow | quote }}
ttftBucketAbove: {{ $s.bucketAbove | quote }}
ttftBucketBelowMs: {{ round (mulf (float64 $s.bucketBelow) 1000.0) 9 | toString | quote }}
ttftBucketAboveMs: {{ round (mulf (float64 $s.bucketAbove) 1000.0) 9 | toString | quote }}
{{- /* inside a PromQL string: backslash and quote escaped */}}
job: {{ $r.job | replace "\\" "\\\\" | replace "\"" "\\\"" | quote }}
{{- end -}}

{{/* Slots whose literal is the inside of a PromQL string; the others are numbers. */}}
{{- define "llm-gpu-exporter.ruleStringSlots" -}}
job
{{- end -}}

{{- define "llm-gpu-exporter.ruleEdits" -}}
edits:
  - rules: [LlmGpuSmSaturated]
    field: expr
    text: "llmgpu_gpu_sm_active_ratio > {smActiveRatio}"
  - rules: [LlmGpuClocksThrottled]
    field: expr
    text: "[5m]) > {clockThrottledRatio}"
  - rules: [LlmGpuNvLinkErrors]
    field: expr
    text: "llmgpu_gpu_nvlink_errors_total[5m])) > {nvLinkErrors}"
  - rules: [LlmGpuOomRiskHigh]
    field: expr
    text: "llmgpu_diagnosis_oom_risk_ratio >= {oomRiskRatio}"
  - rules: [LlmGpuMemoryExhaustion]
    field: expr
    text: "llmgpu_gpu_memory_free_bytes / llmgpu_gpu_memory_total_bytes < {memoryFreeRatio}"
  - rules: [LlmGpuKvCacheSaturated]
    field: expr
    text: "llmgpu_engine_kv_cache_usage_ratio > {kvCacheUsageRatio}"
  - rules: [LlmGpuEngineErrorRatioHigh]
    field: expr
    text: "> 0) > {engineErrorRatio}"
  - rules: [LlmGpuEngineErrorRatioHigh]
    field: summary
    text: "More than {engineErrorPercent} %"
  - rules: [LlmGpuExporterStale]
    field: expr
    text: "llmgpu_exporter_collector_sample_age_seconds > {collectorSampleAgeSeconds}"
  - rules: [LlmGpuExporterDown, LlmGpuExporterAbsent]
    field: expr
    text: 'up{job=~"{job}"}'
  - rules: [LlmGpuExporterAbsent]
    field: description
    text: 'up{job=~"{job}"}'
  - rules: [LlmGpuTtftSloBurnFast]
    field: expr
    text: "> 14.4 * {ttftBudget}"
  - rules: [LlmGpuTtftSloBurnSlow]
    field: expr
    text: "> 6 * {ttftBudget}"
  - rules: [LlmGpuTtftSloBurnFast, LlmGpuTtftSloBurnSlow]
    field: summary
    text: "the {ttftMs} ms SLO"
  - rules: [LlmGpuTtftSloBurnFast, LlmGpuTtftSloBurnSlow]
    field: description
    text: "later than {ttftMs} ms"
  - rules: [LlmGpuTtftSloBurnFast, LlmGpuTtftSloBurnSlow]
    field: description
    text: "the {ttftBudgetPercent} % the objective allows"
  # Both buckets in one text: they are told apart by their place in the expression.
  - rules:
      - target_model:llmgpu_engine_ttft_over_slo:ratio_rate5m
      - target_model:llmgpu_engine_ttft_over_slo:ratio_rate30m
      - target_model:llmgpu_engine_ttft_over_slo:ratio_rate1h
      - target_model:llmgpu_engine_ttft_over_slo:ratio_rate6h
    field: expr
    text: >-
      _bucket{le="{ttftBucketBelow}"}[{window}]))
      * ({ttftBucketAboveMs} - {ttftMs}) / ({ttftBucketAboveMs} - {ttftBucketBelowMs})
      + sum without (le) (rate(llmgpu_engine_time_to_first_token_seconds_bucket{le="{ttftBucketAbove}"}[{window}]))
      * ({ttftMs} - {ttftBucketBelowMs}) / ({ttftBucketAboveMs} - {ttftBucketBelowMs})
{{- end -}}

{{/*
Applies one edit to one rule, in place. Takes dict "rule" "edit" "slots" "path".
Builds a regular expression and its replacement from the edit's text, token by token.
*/}}
{{- define "llm-gpu-exporter.applyRuleEdit" -}}
{{- $rule := .rule -}}
{{- $edit := .edit -}}
{{- $name := $rule.alert | default $rule.record -}}
{{- $owner := $rule -}}
{{- if ne $edit.field "expr" -}}
{{- $owner = $rule.annotations -}}
{{- end -}}
{{- $value := index $owner $edit.field | toString -}}
{{- $strings := include "llm-gpu-exporter.ruleStringSlots" . | splitList "\n" -}}
{{- $pattern := "" -}}
{{- $replacement := "" -}}
{{- $group := 0 -}}
{{- range $token := regexFindAll `\{[A-Za-z]+\}|\s+|[^\s{]+|\{` (trim $edit.text) -1 -}}
{{- if or (regexMatch `^\s+$` $token) (eq $token "{window}") -}}
{{- $group = add1 $group -}}
{{- $pattern = print $pattern (ternary `(\s+)` `([0-9a-z]+)` (ne $token "{window}")) -}}
{{- $replacement = printf "%s${%d}" $replacement $group -}}
{{- else if regexMatch `^\{[A-Za-z]+\}$` $token -}}
{{- $slot := trimAll "{}" $token -}}
{{- if not (hasKey $.slots $slot) -}}
{{- fail (printf "templates/_rules.tpl: the edit of %s names an unknown slot %s" $name $token) -}}
{{- end -}}
{{- $pattern = print $pattern (ternary `(?:[^"\\]|\\.)*` `[0-9][0-9.eE+-]*` (has $slot $strings)) -}}
{{- $replacement = print $replacement (get $.slots $slot | replace "$" "$$") -}}
{{- else -}}
{{- $pattern = print $pattern (regexQuoteMeta $token) -}}
{{- $replacement = print $replacement ($token | replace "$" "$$") -}}
{{- end -}}
{{- end -}}
{{- if not (regexMatch $pattern $value) -}}
{{- fail (printf "%s: the %s of %s no longer contains %q, which the chart replaces; change templates/_rules.tpl with the rule" .path $edit.field $name (trim $edit.text)) -}}
{{- end -}}
{{- $_ := set $owner $edit.field (regexReplaceAll $pattern $value $replacement) -}}
{{- end -}}

{{/*
The spec of one PrometheusRule: the parsed rule file with the edits applied, and each
runbook_url pointed at prometheusRule.runbookBaseUrl (left out while that is empty).
Takes dict "root" "path"; prints the groups as YAML.
*/}}
{{- define "llm-gpu-exporter.ruleSpec" -}}
{{- $root := .root -}}
{{- $path := .path -}}
{{- $doc := $root.Files.Get $path | fromYaml -}}
{{- if hasKey $doc "Error" -}}
{{- fail (printf "%s: %s" $path $doc.Error) -}}
{{- end -}}
{{- $slots := include "llm-gpu-exporter.ruleSlots" $root | fromYaml -}}
{{- $edits := (include "llm-gpu-exporter.ruleEdits" $root | fromYaml).edits -}}
{{- $base := $root.Values.prometheusRule.runbookBaseUrl -}}
{{- range $group := $doc.groups -}}
{{- range $rule := $group.rules -}}
{{- $name := $rule.alert | default $rule.record -}}
{{- range $edit := $edits -}}
{{- if has $name $edit.rules -}}
{{- include "llm-gpu-exporter.applyRuleEdit" (dict "rule" $rule "edit" $edit "slots" $slots "path" $path) -}}
{{- end -}}
{{- end -}}
{{- with $rule.annotations -}}
{{- if hasKey . "runbook_url" -}}
{{- if $base -}}
{{- $anchor := index . "runbook_url" | toString | splitList "#" | last -}}
{{- $_ := set . "runbook_url" (printf "%s#%s" $base $anchor) -}}
{{- else -}}
{{- $_ := unset . "runbook_url" -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toYaml $doc -}}
{{- end -}}

{{/* Names of the rules in the chart's rule files, one a line. */}}
{{- define "llm-gpu-exporter.ruleNames" -}}
{{- range $path, $_ := .Files.Glob "alerts/*.rules.yml" -}}
{{- $doc := $.Files.Get $path | fromYaml -}}
{{- if hasKey $doc "Error" -}}
{{- fail (printf "%s: %s" $path $doc.Error) -}}
{{- end -}}
{{- range $group := $doc.groups -}}
{{- range $rule := $group.rules }}
{{ $rule.alert | default $rule.record }}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Values the schema cannot relate: the TTFT target lies between its two buckets; every
edited rule exists. */}}
{{- define "llm-gpu-exporter.validateRules" -}}
{{- $s := .Values.prometheusRule.ttftSlo -}}
{{- $below := float64 $s.bucketBelow -}}
{{- $above := float64 $s.bucketAbove -}}
{{- $seconds := float64 $s.seconds -}}
{{- if not (and (lt $below $seconds) (le $seconds $above)) -}}
{{- fail (printf "prometheusRule.ttftSlo: bucketBelow (%s) < seconds (%v) <= bucketAbove (%s) must hold: the share under the target is interpolated between those two buckets" $s.bucketBelow $seconds $s.bucketAbove) -}}
{{- end -}}
{{- $names := include "llm-gpu-exporter.ruleNames" . | trim | splitList "\n" -}}
{{- if .Files.Glob "alerts/*.rules.yml" -}}
{{- range $edit := (include "llm-gpu-exporter.ruleEdits" . | fromYaml).edits -}}
{{- range $rule := $edit.rules -}}
{{- if not (has $rule $names) -}}
{{- fail (printf "alerts/*.rules.yml has no rule %s, which templates/_rules.tpl edits" $rule) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
