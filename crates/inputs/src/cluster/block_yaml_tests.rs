//! Tests of the block-style YAML rewriting: whatever it rewrites reads as the YAML reader
//! reads it, and what it cannot rewrite exactly is left to that reader.

use proptest::prelude::*;
use serde_json::{Value, json};

use super::block_yaml::to_json;

/// The documents of `text` as the rewriting reads them, `None` where it leaves the text to
/// the YAML reader.
fn fast(text: &str) -> Option<Vec<Value>> {
    let docs = to_json(text)?;
    Some(
        docs.iter()
            .map(|d| serde_json::from_str(d.json).unwrap_or_else(|e| panic!("{e}: {}", d.json)))
            .collect(),
    )
}

/// Whether the rewriting reads `text`; where it does, its documents are those the YAML
/// reader reads.
pub(super) fn same_as_yaml_reader(text: &str) -> bool {
    let Some(docs) = fast(text) else {
        return false;
    };
    let expected: Vec<Value> = serde_saphyr::from_multiple(text)
        .unwrap_or_else(|e| panic!("rewritten, but the YAML reader refuses it: {e}\n{text}"));
    assert_eq!(docs, expected, "{text}");
    true
}

/// `text` is rewritten, as the YAML reader reads it.
pub(super) fn rewritten(text: &str) {
    assert!(
        same_as_yaml_reader(text),
        "left to the YAML reader:\n{text}"
    );
}

/// `text` is left to the YAML reader.
fn left(text: &str) {
    assert!(fast(text).is_none(), "rewritten: {:?}\n{text}", fast(text));
}

/// Plain values the rewriting types as the YAML reader types them.
const CERTAIN: &[&str] = &[
    "true",
    "false",
    "True",
    "FALSE",
    "yes",
    "No",
    "on",
    "OFF",
    "y",
    "N",
    "null",
    "Null",
    "NULL",
    "~",
    "0",
    "-0",
    "+0",
    "-1",
    "12",
    "+1",
    "1.5",
    "-0.5",
    "+2.5",
    "1e3",
    "1E3",
    "1e+3",
    "2.5e-3",
    "007",
    "-007",
    "00",
    ".5",
    "5.",
    "-.5",
    "18446744073709551615",
    "-9223372036854775808",
    "2026-11-28",
    "2026-11-28T10:00:00Z",
    "10Gi",
    "100m",
    "1.2.3",
    "1:30",
    "a:b",
    "x y",
    "value-1",
    "-foo",
    "+",
    "-a-",
    "inf",
    "nan",
    "Infinity",
    "1e",
    "e3",
    ".",
    "a#b",
    "http://x.example/a?b=c",
    "0.0",
    "yesno",
    "nulls",
    "ñ",
    "64",
    "512Gi",
    "v1.36.0",
    "kind://docker/kind/node-1",
    "0b0d6a3e-58c2",
    "+.5",
    "01.5",
    "0e0",
    "1e+",
    "+.",
    "_1",
    "NaN",
    "Inf",
    "1.5.2",
    "0e_",
    "-+5",
    "--5",
    "+-1",
    "--.0",
    "1_0.5",
    "1_0e5",
    "a_1",
    "0xgg",
    "--epochs=3",
    "-+x",
    "+-",
    "1_a",
    "123e4567-e89b-12d3",
    "0B",
    "0x",
    "0o",
    "-0b",
    "0b2",
    "0o9",
    "0bA",
    "0oF",
    "0xG",
];

/// Plain values whose type is left to the YAML reader.
const UNCERTAIN: &[&str] = &[
    "1_000",
    "1_",
    "1__0",
    "-1_0",
    "0_1",
    "0x1F",
    "0o17",
    "0b11",
    ".inf",
    "-.inf",
    ".nan",
    ".NaN",
    "+.INF",
    "18446744073709551616",
    "-9223372036854775809",
    "1e999",
];

#[test]
fn plain_values_are_typed_as_the_yaml_reader_types_them() {
    for v in CERTAIN {
        rewritten(&format!("k: {v}\n"));
        rewritten(&format!("- {v}\n- {v} # comment\n"));
    }
    for v in UNCERTAIN {
        left(&format!("k: {v}\n"));
    }
    assert_eq!(fast("k: 007\n").unwrap(), [json!({"k": 7.0})]);
    assert_eq!(fast("k: '007'\n").unwrap(), [json!({"k": "007"})]);
}

#[test]
fn quoted_values_and_keys_are_strings() {
    for text in [
        "k: '1.0'\n",
        "k: \"1.0\"\n",
        "k: 'it''s'\n",
        "k: ''\n",
        "k: \"\"\n",
        "k: \"a\\\"b\\\\c\\n\\td\\/e\\u00e9\\x41\\U0001F600\"\n",
        "k: \"true\" # quoted\n",
        "'quoted key': 1\n\"a: b\": 2\n'': empty\n",
        "\"escaped\\tkey\": v\n",
        "k: 'a # not a comment'\n",
        "k: \"#x\"\n",
    ] {
        rewritten(text);
    }
}

#[test]
fn block_collections_in_every_indentation_are_rewritten() {
    for text in [
        "a:\n  b:\n    c: 1\n  d: x\ne: y\n",
        "a:\n    b: 1\n    c:\n      - 1\n      - 2\n",
        "a:\n- 1\n- x\nb: 2\n",
        "a:\n  - b: 1\n    c: 2\n  - d: 3\n",
        "a:\n- b: 1\n  c:\n  - x\n  - y\n  e: 2\n- {}\n- []\n",
        "-   a: 1\n    b: 2\n-   c\n",
        "- - a\n  - - b\n    - c\n- -   d: 1\n      e: 2\n  - f\n",
        "- \n- ~\n-\n  - 1\n",
        "a:\nb: {}\nc: []\nd:\n",
        "  a: 1\n  b: 2\n",
        "- a\n- b\n",
        "a: {} # empty\nb: [] # empty\n",
        "a:\n  # a comment\n  b: 1 # after\n# at the start\n\n  c: 2\n",
        "key with spaces: v\nk.io/x-y_z: w\nf:spec: {}\n",
        "a b: 1\na\"b: 2\na'b: 3\n-a: 4\na-: 5\n?a: 6\n:a: 7\na:b: 8\nc  : 9\n",
        "\"1\": a\n'true': b\n\"<<\": c\n'~': d\n",
        "a: b # c\nd: e#f\ng: h - i\nj: ---\nk: x:y\nl: a,b\n",
        "- # comment\n  a: 1\n-\n-\n- a:\n",
        "a:    # comment\n  b: 1\n",
        "fieldsV1:\n  f:status:\n    f:conditions:\n      k:{\"type\":\"Ready\"}:\n        .: {}\n        f:status: {}\n  f:metadata:\n    f:finalizers:\n      v:\"example.com/x\": {}\n",
        "ключ: значение\nemoji: 😀\nnbsp: a\u{a0}\n",
        "a: x\u{2028}y\nb: 'x\u{2029}y'\nc: |\n  x\u{2028}\n",
    ] {
        rewritten(text);
    }
}

#[test]
fn literal_block_scalars_are_rewritten_with_their_chomping() {
    for text in [
        "a: |\n  line 1\n  line 2\nb: 1\n",
        "a: |-\n  line 1\n\n  line 3\n\n\nb: 1\n",
        "a: |+\n  line 1\n\n\nb: 1\n",
        "a: |\n    indented\n      more\n    # not a comment\nb: 1\n",
        "a: |\n\n  after a blank line\n",
        "a: |\nb: 1\n",
        "a: |-\n",
        "a: |+\nb: 1\n",
        "a: |2\n   x\n  y\n",
        "a: |-1\n  x\n",
        "a:\n  b: |4+\n        x\n",
        "- |2\n    x\n- |1-\n  y\n",
        "- a: |2\n     x\n",
        "a: |+\n\n\n",
        "- |+\n\n  \n- x\n",
        "- |\n  x\n- |-\n  y\n",
        "a:\n- b: |\n    {\"json\": true}\n  c: 1\n",
        "a: | # comment\n  x\n  \n  y\n",
        "a: |\n  x\n     \n  y\n",
        "a: |\n  tab\there\n",
    ] {
        rewritten(text);
    }
}

/// Long values as kubectl prints them, wrapped at 80 columns, and other values that go on
/// over several lines.
#[test]
fn values_over_several_lines_are_folded() {
    for text in [
        "a: plain\n  continued\nb: 1\n",
        "a: plain\n  continued\n\n  after a blank line\n\n\n  two\nb: 1\n",
        "a: plain   \n     spaces   \n",
        "a: plain\n  continued # comment\nb: 1\n",
        "- plain\n  continued\n- x\n",
        "- a: plain\n    continued\n  b: 1\n",
        "a: 'quoted\n  continued'\nb: 1\n",
        "a: 'it''s\n  quoted: ''really''\n\n  # not a comment\n   x' # comment\n",
        "a: 'quoted   \n   spaces   '\n",
        "a: '\n  x'\n",
        "a: 'x\n\n  '\n",
        "a: 'x\n  '\n",
        "a: 'x\n  y\n  z'\n",
        "- 'quoted\n  continued'\n",
        "a: 1\n  2\n",
        "a: true\n  false\n",
        "metadata:\n  annotations:\n    kubernetes.io/limit-ranger: 'LimitRanger plugin set: cpu request for container\n      hostnames'\n",
    ] {
        rewritten(text);
    }
    // Continuation lines starting with any character, as values and as sequence items, at
    // every indentation: where rewritten, read as the YAML reader reads them.
    for c in "-?:,[]{}#&*!|>'\"%@`~. ".chars() {
        for text in [
            format!("a: x\n  {c}y\n"),
            format!("a: x\n  {c} y\n"),
            format!("a: 'x\n  {c}y'\n"),
            format!("- x\n  {c}y\n"),
            format!("- x\n {c}y\n"),
            format!("a:\n- x\n {c}y\n"),
            format!("a:\n  - x\n   {c}y\n"),
        ] {
            same_as_yaml_reader(&text);
        }
    }
    for text in [
        "a: plain\n  b: 1\n",
        "a: plain # comment\n  continued\n",
        "a: plain\n  continued # comment\n  more\n",
        "a: 'quoted\ncontinued'\n",
        "a: 'quoted\n",
        "a: 'quoted\n  continued' x\n",
        "a: \"quoted\n  continued\"\n",
    ] {
        left(text);
    }
}

#[test]
fn folded_block_scalars_are_rewritten() {
    for text in [
        "a: >\n  folded\n  line\nb: 1\n",
        "a: >-\n  folded\n  line\n\n  next\n  line\n",
        "a: >+\n  folded\n\n\nb: 1\n",
        "a: >\n\n folded\n line\n\n next\n line\n   * bullet\n\n   * list\n   * lines\n\n last\n line\n\n# Comment\n",
        "a: >\n  text\n    more\n  text\n\n    more\n\n  text\n",
        "a: >2\n    indented first\n  then\n",
        "- >-\n  x\n  y\n- >\n\n",
        "a: >\n  trailing spaces   \n  next\n",
        "a: >\n  x\n     \n  y\n",
    ] {
        rewritten(text);
    }
}

#[test]
fn documents_are_rewritten_in_order() {
    for text in [
        "a: 1\n---\nb: 2\n",
        "---\na: 1\n---\nb: 2\n...\n",
        "--- # first\na: 1\n...\n---\nb: 2\n",
        "---\n---\na: 1\n",
        "---\na: 1\n---\n",
        "# only a comment\n",
        "",
        "---\n",
        "a: 1\n...\n",
    ] {
        rewritten(text);
    }
}

#[test]
fn text_outside_the_subset_is_left_to_the_yaml_reader() {
    for text in [
        "a: &x 1\nb: *x\n",
        "a: !!str 1\n",
        "a: {b: 1}\n",
        "a: [1, 2]\n",
        "a: \"quoted\n  continued\"\n",
        "a: 1\na: 2\n",
        "a: 1\n\"a\": 2\n",
        "? a\n: 1\n",
        "%YAML 1.2\n---\na: 1\n",
        "a:\n\tb: 1\n",
        "a: 1\r\n",
        "just a scalar\n",
        "<<: {}\n",
        "1: a\n",
        "true: a\n",
        "a: b: c\n",
        "a: \"\\q\"\n",
        "a:\n  b\n",
        "a:\n  - 1\n  b: 2\n",
        "a: 1\n...\nb: 2\n",
        "a #b: 1\n",
        "a: 'x'#c\n",
        "- &a x\n",
        "&a a: 1\n",
        "a: *x\n",
        "a:\n    b: 1\n  c: 2\n",
        "~: a\n",
        "on: a\n",
        "--- a: 1\n",
        "a: @x\n",
        "a: `x`\n",
        "a: |\n\n\n   \n  x\n",
    ] {
        left(text);
    }
    // A key repeated after many others is found too.
    let many: String = (0..100).map(|i| format!("k{i}: {i}\n")).collect();
    rewritten(&many);
    left(&format!("{many}k7: again\n"));
}

/// Whether the JSON reader reads `f` back exactly from its JSON text.
fn exact(f: &f64) -> bool {
    serde_json::from_str::<f64>(&Value::from(*f).to_string()).ok() == Some(*f)
}

/// Any JSON value: null, booleans, numbers, strings, lists and mappings.
fn any_value() -> impl Strategy<Value = Value> {
    let text = "[a-zA-Z0-9 :#'\"\\\\_./\\-\n\t{}\\[\\],&*!|>%@`?~é]{0,12}";
    let long = "[a-z0-9 :#'\",.-]{60,140}";
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        // Floats the JSON reader reads back exactly (others are left to the YAML reader).
        (-1e6..1e6f64)
            .prop_filter("read back exactly", exact)
            .prop_map(Value::from),
        any::<f64>()
            .prop_filter("read back exactly", exact)
            .prop_map(Value::from),
        text.prop_map(Value::from),
        long.prop_map(Value::from),
        prop::sample::select(vec![
            "true", "no", "null", "~", "", "007", "1e3", "1_000", "0x1F", ".inf", "1.5", "-0",
            "- a", "a: b", " x", "x ", "#c", "|", "---", "...", "a\n\nb\n", "\n",
        ])
        .prop_map(Value::from),
    ];
    leaf.prop_recursive(5, 48, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::from),
            prop::collection::btree_map(text, inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// What the YAML serializer prints for any mapping is rewritten, and reads back as the
    /// value printed.
    #[test]
    fn serialized_mappings_are_rewritten_as_printed(
        fields in prop::collection::btree_map("[a-z]{1,8}", any_value(), 1..6),
    ) {
        let value = Value::Object(fields.into_iter().collect());
        let text = serde_saphyr::to_string(&value).unwrap();
        let read_back: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
        prop_assume!(read_back == [value.clone()]);
        prop_assert_eq!(fast(&text), Some(vec![value]), "{}", text);
    }
}

/// `words` printed as the value of `key` the way kubectl wraps long values: after the key
/// on the first line, then on lines indented by two more spaces than the key, each line at
/// most `width` characters; single-quoted when `quote`.
fn wrapped(indent: usize, key: &str, words: &[String], width: usize, quote: bool) -> String {
    let pad = " ".repeat(indent);
    let mut text = format!("{pad}{key}: {}", if quote { "'" } else { "" });
    let mut line_len = text.len();
    for (i, w) in words.iter().enumerate() {
        let w = if quote {
            w.replace('\'', "''")
        } else {
            w.clone()
        };
        if i > 0 && line_len + 1 + w.len() > width {
            text.push_str(&format!("\n{pad}  "));
            line_len = indent + 2;
        } else if i > 0 {
            text.push(' ');
            line_len += 1;
        }
        text.push_str(&w);
        line_len += w.len();
    }
    if quote {
        text.push('\'');
    }
    text.push('\n');
    text
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Long values wrapped over several lines, as kubectl prints them, are rewritten and
    /// read as one line, as the YAML reader reads them.
    #[test]
    fn wrapped_values_are_rewritten_as_one_line(
        plain_words in prop::collection::vec("[a-z0-9][a-z0-9.,()/-]{0,11}", 2..30),
        quoted_words in prop::collection::vec("[a-zA-Z0-9 :#'\",.-]{1,12}", 2..20),
        width in 20usize..90,
        indent in 0usize..3,
    ) {
        let quoted_words: Vec<String> = quoted_words
            .iter()
            .map(|w| w.trim().to_string())
            .filter(|w| !w.is_empty())
            .collect();
        prop_assume!(!quoted_words.is_empty());
        let nested = |body: String| format!("metadata:\n{body}other: x\n");
        for (text, value) in [
            (
                nested(wrapped(indent * 2 + 2, "plain", &plain_words, width, false)),
                plain_words.join(" "),
            ),
            (
                nested(wrapped(indent * 2 + 2, "quoted", &quoted_words, width, true)),
                quoted_words.join(" "),
            ),
        ] {
            prop_assert!(same_as_yaml_reader(&text), "{}", text);
            let docs = fast(&text).unwrap();
            let read = docs[0]["metadata"].as_object().unwrap().values().next().unwrap();
            prop_assert_eq!(read.as_str(), Some(value.as_str()), "{}", text);
        }
    }
}
