//! The `codegen` language: a tiny list language in the style of DeepCoder's DSL, one
//! statement per line, and its sandboxed interpreter.
//!
//! # Specification
//!
//! A program transforms one list of integers, `xs`, which starts as the input. It has 26
//! integer variables: `x` is the current element inside `keep` and `map`; `a`–`w`, `y`, `z`
//! are bound by `let` (reading an unbound one is an error). Every line is one statement; its
//! operands are written without spaces (spaces in them are ignored):
//!
//! | statement     | effect on `xs`                                                       |
//! |---------------|----------------------------------------------------------------------|
//! | `keep C`      | keep the elements `x` for which the condition `C` holds              |
//! | `map E`       | replace every element `x` by `E`                                     |
//! | `take E`      | the first `E` elements (`E` without `x`, ≥ 0; all if fewer)          |
//! | `drop E`      | all but the first `E` elements                                       |
//! | `rev`         | reverse                                                              |
//! | `sort`        | ascending order                                                      |
//! | `scan F`      | running fold: `[x0, x0 F x1, (x0 F x1) F x2, …]`                     |
//! | `pair F`      | `[x0 F x1, x2 F x3, …]`; an odd last element is kept as it is        |
//! | `fold F`      | `[x0 F x1 F … F xn]`; of an empty list `[0]` (`[1]` for `*`)         |
//! | `count`       | `[number of elements]`                                               |
//! | `let v=R`     | bind `v` to `R`: `sum`, `len`, `max`, `min`, `first`, `last` of `xs` (0 for an empty list) or an expression without `x`; `xs` unchanged |
//! | `ret`         | end of the program: its output is `xs`                               |
//!
//! - `F` is one of `+ - * max min`.
//! - An expression `E` is atoms joined by operators, evaluated strictly left to right (no
//!   precedence: `x+1*2` is `(x+1)*2`). An atom is `x`, a variable or a decimal literal of at
//!   most 9 digits. The operators are `+ - * / %`; `/` and `%` are Euclidean (the remainder is
//!   never negative), and dividing by 0 is an error.
//! - A condition `C` is `E op E` with `op` one of `>= <= == != > <`.
//!
//! # Sandbox
//!
//! There is no I/O, no host access and no jump: every statement is one pass over `xs`, and no
//! statement makes `xs` longer than `max(len, 1)`, so a program of `L` lines on an input of
//! `n` elements does at most `O(L · max(n, 1) · log)` work and holds at most `max(n, 1)`
//! values and 26 variables; it always terminates with an output or an error. The limits that
//! can be hit are checked: a line longer than [`MAX_LINE_CHARS`] characters is rejected, and
//! every value computed (a literal, an operator's result, a fold) must lie in
//! `[-MAX_ABS, MAX_ABS]`, or the run stops with [`LangError::OutOfRange`]. Arithmetic is
//! checked, so nothing overflows.

use std::fmt;

/// The longest line the parser accepts, in characters.
pub const MAX_LINE_CHARS: usize = 48;
/// The largest magnitude of any value a program computes.
pub const MAX_ABS: i64 = 1_000_000_000;
/// The most digits a literal may have.
const MAX_LITERAL_DIGITS: usize = 9;

/// Why a line does not parse or a program stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LangError {
    /// The line is longer than [`MAX_LINE_CHARS`].
    TooLong,
    /// The first word is not a statement.
    UnknownStatement,
    /// The operand of a statement does not parse.
    Syntax,
    /// `x` used outside `keep` and `map`.
    XOutside,
    /// A variable read before any `let` bound it.
    Unbound(char),
    /// `/` or `%` by zero.
    DivisionByZero,
    /// A value beyond `±MAX_ABS`.
    OutOfRange,
    /// `take`/`drop` of a negative count.
    NegativeCount,
}

impl fmt::Display for LangError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TooLong => write!(f, "line too long"),
            Self::UnknownStatement => write!(f, "unknown statement"),
            Self::Syntax => write!(f, "syntax"),
            Self::XOutside => write!(f, "x outside keep/map"),
            Self::Unbound(v) => write!(f, "unbound {v}"),
            Self::DivisionByZero => write!(f, "division by zero"),
            Self::OutOfRange => write!(f, "out of range"),
            Self::NegativeCount => write!(f, "negative count"),
        }
    }
}

impl std::error::Error for LangError {}

/// A binary operator of an expression.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
}

/// A comparison of a condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cmp {
    Ge,
    Le,
    Eq,
    Ne,
    Gt,
    Lt,
}

/// The operator of `scan`, `pair` and `fold`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FoldOp {
    /// `+`
    Add,
    /// `-`
    Sub,
    /// `*`
    Mul,
    /// `max`
    Max,
    /// `min`
    Min,
}

impl FoldOp {
    /// The operator as a program writes it.
    pub fn symbol(self) -> &'static str {
        match self {
            Self::Add => "+",
            Self::Sub => "-",
            Self::Mul => "*",
            Self::Max => "max",
            Self::Min => "min",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "+" => Self::Add,
            "-" => Self::Sub,
            "*" => Self::Mul,
            "max" => Self::Max,
            "min" => Self::Min,
            _ => return None,
        })
    }

    fn apply(self, a: i64, b: i64) -> Result<i64, LangError> {
        let v = match self {
            Self::Add => a.checked_add(b),
            Self::Sub => a.checked_sub(b),
            Self::Mul => a.checked_mul(b),
            Self::Max => Some(a.max(b)),
            Self::Min => Some(a.min(b)),
        };
        in_range(v)
    }
}

/// What `let v=R` binds.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Bind {
    Sum,
    Len,
    Max,
    Min,
    First,
    Last,
    Expr(Expr),
}

/// An atom of an expression.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Atom {
    X,
    Num(i64),
    Var(usize),
}

/// `first (op atom)*`, evaluated left to right.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Expr {
    first: Atom,
    rest: Vec<(BinOp, Atom)>,
}

/// One parsed line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stmt(StmtKind);

#[derive(Debug, Clone, PartialEq, Eq)]
enum StmtKind {
    Keep(Expr, Cmp, Expr),
    Map(Expr),
    Take(Expr),
    Drop(Expr),
    Rev,
    Sort,
    Scan(FoldOp),
    Pair(FoldOp),
    Fold(FoldOp),
    Count,
    Let(usize, Bind),
    Ret,
}

impl Stmt {
    /// Whether this is `ret`.
    pub fn is_ret(&self) -> bool {
        self.0 == StmtKind::Ret
    }
}

fn in_range(v: Option<i64>) -> Result<i64, LangError> {
    match v {
        Some(v) if (-MAX_ABS..=MAX_ABS).contains(&v) => Ok(v),
        _ => Err(LangError::OutOfRange),
    }
}

fn var_index(c: char) -> Option<usize> {
    (c.is_ascii_lowercase() && c != 'x').then(|| (c as u8 - b'a') as usize)
}

fn parse_atom(s: &str) -> Result<Atom, LangError> {
    if s == "x" {
        return Ok(Atom::X);
    }
    let mut chars = s.chars();
    if let (Some(c), None) = (chars.next(), chars.next())
        && let Some(v) = var_index(c)
    {
        return Ok(Atom::Var(v));
    }
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(LangError::Syntax);
    }
    if s.len() > MAX_LITERAL_DIGITS {
        return Err(LangError::OutOfRange);
    }
    s.parse::<i64>()
        .map(Atom::Num)
        .map_err(|_| LangError::Syntax)
}

fn parse_expr(s: &str) -> Result<Expr, LangError> {
    let mut atoms = Vec::new();
    let mut ops = Vec::new();
    let mut start = 0;
    for (i, c) in s.char_indices() {
        let op = match c {
            '+' => BinOp::Add,
            '-' => BinOp::Sub,
            '*' => BinOp::Mul,
            '/' => BinOp::Div,
            '%' => BinOp::Rem,
            _ => continue,
        };
        atoms.push(parse_atom(&s[start..i])?);
        ops.push(op);
        start = i + 1;
    }
    atoms.push(parse_atom(&s[start..])?);
    let mut atoms = atoms.into_iter();
    let first = atoms.next().ok_or(LangError::Syntax)?;
    Ok(Expr {
        first,
        rest: ops.into_iter().zip(atoms).collect(),
    })
}

fn parse_cond(s: &str) -> Result<(Expr, Cmp, Expr), LangError> {
    const CMPS: [(&str, Cmp); 6] = [
        (">=", Cmp::Ge),
        ("<=", Cmp::Le),
        ("==", Cmp::Eq),
        ("!=", Cmp::Ne),
        (">", Cmp::Gt),
        ("<", Cmp::Lt),
    ];
    let (at, text, cmp) = CMPS
        .iter()
        .filter_map(|&(t, c)| s.find(t).map(|i| (i, t, c)))
        .min_by_key(|&(i, t, _)| (i, std::cmp::Reverse(t.len())))
        .ok_or(LangError::Syntax)?;
    Ok((
        parse_expr(&s[..at])?,
        cmp,
        parse_expr(&s[at + text.len()..])?,
    ))
}

/// Parses one line (surrounding whitespace ignored).
pub fn parse(line: &str) -> Result<Stmt, LangError> {
    let line = line.trim();
    if line.chars().nth(MAX_LINE_CHARS).is_some() {
        return Err(LangError::TooLong);
    }
    let (word, rest) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
    let rest: String = rest.chars().filter(|c| !c.is_whitespace()).collect();
    let no_operand = |k: StmtKind| {
        if rest.is_empty() {
            Ok(k)
        } else {
            Err(LangError::Syntax)
        }
    };
    let fold_op = || FoldOp::parse(&rest).ok_or(LangError::Syntax);
    let kind = match word {
        "keep" => {
            let (a, c, b) = parse_cond(&rest)?;
            StmtKind::Keep(a, c, b)
        }
        "map" => StmtKind::Map(parse_expr(&rest)?),
        "take" => StmtKind::Take(parse_expr(&rest)?),
        "drop" => StmtKind::Drop(parse_expr(&rest)?),
        "rev" => no_operand(StmtKind::Rev)?,
        "sort" => no_operand(StmtKind::Sort)?,
        "count" => no_operand(StmtKind::Count)?,
        "ret" => no_operand(StmtKind::Ret)?,
        "scan" => StmtKind::Scan(fold_op()?),
        "pair" => StmtKind::Pair(fold_op()?),
        "fold" => StmtKind::Fold(fold_op()?),
        "let" => {
            let (name, value) = rest.split_once('=').ok_or(LangError::Syntax)?;
            let mut chars = name.chars();
            let v = match (chars.next(), chars.next()) {
                (Some(c), None) => var_index(c).ok_or(LangError::Syntax)?,
                _ => return Err(LangError::Syntax),
            };
            let bind = match value {
                "sum" => Bind::Sum,
                "len" => Bind::Len,
                "max" => Bind::Max,
                "min" => Bind::Min,
                "first" => Bind::First,
                "last" => Bind::Last,
                e => Bind::Expr(parse_expr(e)?),
            };
            StmtKind::Let(v, bind)
        }
        _ => return Err(LangError::UnknownStatement),
    };
    Ok(Stmt(kind))
}

/// The interpreter's state: the list and the variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Machine {
    /// The current list.
    pub xs: Vec<i64>,
    vars: [Option<i64>; 26],
}

impl Machine {
    /// A machine whose list is `input`.
    pub fn new(input: &[i64]) -> Self {
        Self {
            xs: input.to_vec(),
            vars: [None; 26],
        }
    }

    fn atom(&self, a: Atom, x: Option<i64>) -> Result<i64, LangError> {
        match a {
            Atom::X => x.ok_or(LangError::XOutside),
            Atom::Num(n) => in_range(Some(n)),
            Atom::Var(v) => self.vars[v].ok_or(LangError::Unbound((b'a' + v as u8) as char)),
        }
    }

    fn eval(&self, e: &Expr, x: Option<i64>) -> Result<i64, LangError> {
        let mut acc = self.atom(e.first, x)?;
        for &(op, a) in &e.rest {
            let b = self.atom(a, x)?;
            let v = match op {
                BinOp::Add => acc.checked_add(b),
                BinOp::Sub => acc.checked_sub(b),
                BinOp::Mul => acc.checked_mul(b),
                BinOp::Div | BinOp::Rem if b == 0 => return Err(LangError::DivisionByZero),
                BinOp::Div => acc.checked_div_euclid(b),
                BinOp::Rem => acc.checked_rem_euclid(b),
            };
            acc = in_range(v)?;
        }
        Ok(acc)
    }

    fn count(&self, e: &Expr) -> Result<usize, LangError> {
        let n = self.eval(e, None)?;
        usize::try_from(n).map_err(|_| LangError::NegativeCount)
    }

    fn fold(xs: &[i64], op: FoldOp) -> Result<i64, LangError> {
        let Some((&first, rest)) = xs.split_first() else {
            return Ok(if op == FoldOp::Mul { 1 } else { 0 });
        };
        rest.iter().try_fold(first, |acc, &b| op.apply(acc, b))
    }

    /// Executes one statement (`ret` does nothing).
    pub fn exec(&mut self, stmt: &Stmt) -> Result<(), LangError> {
        match &stmt.0 {
            StmtKind::Keep(a, cmp, b) => {
                let mut kept = Vec::with_capacity(self.xs.len());
                for &x in &self.xs {
                    let (l, r) = (self.eval(a, Some(x))?, self.eval(b, Some(x))?);
                    let hold = match cmp {
                        Cmp::Ge => l >= r,
                        Cmp::Le => l <= r,
                        Cmp::Eq => l == r,
                        Cmp::Ne => l != r,
                        Cmp::Gt => l > r,
                        Cmp::Lt => l < r,
                    };
                    if hold {
                        kept.push(x);
                    }
                }
                self.xs = kept;
            }
            StmtKind::Map(e) => {
                self.xs = self
                    .xs
                    .iter()
                    .map(|&x| self.eval(e, Some(x)))
                    .collect::<Result<_, _>>()?;
            }
            StmtKind::Take(e) => {
                let n = self.count(e)?;
                self.xs.truncate(n);
            }
            StmtKind::Drop(e) => {
                let n = self.count(e)?.min(self.xs.len());
                self.xs.drain(..n);
            }
            StmtKind::Rev => self.xs.reverse(),
            StmtKind::Sort => self.xs.sort_unstable(),
            StmtKind::Scan(op) => {
                let mut acc: Option<i64> = None;
                for x in &mut self.xs {
                    let v = match acc {
                        None => *x,
                        Some(a) => op.apply(a, *x)?,
                    };
                    *x = v;
                    acc = Some(v);
                }
            }
            StmtKind::Pair(op) => {
                self.xs = self
                    .xs
                    .chunks(2)
                    .map(|c| match c {
                        [a, b] => op.apply(*a, *b),
                        [a] => Ok(*a),
                        _ => Ok(0),
                    })
                    .collect::<Result<_, _>>()?;
            }
            StmtKind::Fold(op) => self.xs = vec![Self::fold(&self.xs, *op)?],
            StmtKind::Count => self.xs = vec![self.xs.len() as i64],
            StmtKind::Let(v, bind) => {
                let xs = &self.xs;
                let value = match bind {
                    Bind::Sum => Self::fold(xs, FoldOp::Add)?,
                    Bind::Len => xs.len() as i64,
                    Bind::Max => Self::fold(xs, FoldOp::Max)?,
                    Bind::Min => Self::fold(xs, FoldOp::Min)?,
                    Bind::First => xs.first().copied().unwrap_or(0),
                    Bind::Last => xs.last().copied().unwrap_or(0),
                    Bind::Expr(e) => self.eval(e, None)?,
                };
                self.vars[*v] = Some(value);
            }
            StmtKind::Ret => {}
        }
        Ok(())
    }
}

/// Runs `program` on `input`: the final list, or the first error.
pub fn run(program: &[Stmt], input: &[i64]) -> Result<Vec<i64>, LangError> {
    let mut m = Machine::new(input);
    for s in program {
        m.exec(s)?;
    }
    Ok(m.xs)
}

/// Parses and runs lines of text (a test and tooling helper).
pub fn run_text(lines: &[&str], input: &[i64]) -> Result<Vec<i64>, LangError> {
    let program = lines
        .iter()
        .map(|l| parse(l))
        .collect::<Result<Vec<_>, _>>()?;
    run(&program, input)
}

/// A list as programs and observations show it: `[3 -1 7]`.
pub fn show(xs: &[i64]) -> String {
    let body: Vec<String> = xs.iter().map(i64::to_string).collect();
    format!("[{}]", body.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(lines: &[&str], input: &[i64]) -> Result<Vec<i64>, LangError> {
        run_text(lines, input)
    }

    #[test]
    fn statements_compute_hand_checked_results() {
        let xs = [5, 1, 7, 2];
        assert_eq!(run(&["keep x>2"], &xs), Ok(vec![5, 7]));
        assert_eq!(run(&["keep x%2==0"], &xs), Ok(vec![2]));
        assert_eq!(run(&["keep x >= 2", "map x*2+1"], &xs), Ok(vec![11, 15, 5]));
        // Left to right, no precedence.
        assert_eq!(run(&["map x+1*2"], &[3]), Ok(vec![8]));
        assert_eq!(run(&["take 2"], &xs), Ok(vec![5, 1]));
        assert_eq!(run(&["take 9"], &xs), Ok(vec![5, 1, 7, 2]));
        assert_eq!(run(&["drop 3"], &xs), Ok(vec![2]));
        assert_eq!(run(&["drop 30"], &xs), Ok(vec![]));
        assert_eq!(run(&["rev"], &xs), Ok(vec![2, 7, 1, 5]));
        assert_eq!(run(&["sort"], &xs), Ok(vec![1, 2, 5, 7]));
        assert_eq!(run(&["scan +"], &xs), Ok(vec![5, 6, 13, 15]));
        assert_eq!(run(&["scan max"], &xs), Ok(vec![5, 5, 7, 7]));
        assert_eq!(run(&["pair +"], &xs), Ok(vec![6, 9]));
        assert_eq!(run(&["pair min"], &[4, 9, 3]), Ok(vec![4, 3]));
        assert_eq!(run(&["fold +"], &xs), Ok(vec![15]));
        assert_eq!(run(&["fold -"], &xs), Ok(vec![-5]));
        assert_eq!(run(&["fold *"], &[]), Ok(vec![1]));
        assert_eq!(run(&["fold max"], &[]), Ok(vec![0]));
        assert_eq!(run(&["count"], &xs), Ok(vec![4]));
        assert_eq!(run(&["let a=min", "map x-a"], &xs), Ok(vec![4, 0, 6, 1]));
        assert_eq!(
            run(&["let b=len", "let c=b*3", "map x+c"], &[1]),
            Ok(vec![4])
        );
        assert_eq!(
            run(&["let a=max", "keep x<a", "ret"], &xs),
            Ok(vec![5, 1, 2])
        );
        assert_eq!(
            run(&["let a=last", "let b=first", "map a-b"], &xs),
            Ok(vec![-3; 4])
        );
        // Euclidean division and remainder.
        assert_eq!(run(&["map x-8/3", "map x%3"], &[1]), Ok(vec![0]));
        assert_eq!(run(&["map 0-x%3"], &[7]), Ok(vec![2]));
        assert_eq!(run(&["map 0-7/2"], &[0]), Ok(vec![-4]));
    }

    #[test]
    fn errors_are_named_and_nothing_overflows() {
        assert_eq!(parse("print x"), Err(LangError::UnknownStatement));
        assert_eq!(parse("keep x"), Err(LangError::Syntax));
        assert_eq!(parse("map x+"), Err(LangError::Syntax));
        assert_eq!(parse("map +x"), Err(LangError::Syntax));
        assert_eq!(parse("map xx"), Err(LangError::Syntax));
        assert_eq!(parse("rev 2"), Err(LangError::Syntax));
        assert_eq!(parse("let x=3"), Err(LangError::Syntax));
        assert_eq!(parse("let ab=3"), Err(LangError::Syntax));
        assert_eq!(parse("scan /"), Err(LangError::Syntax));
        assert_eq!(parse("map 1234567890"), Err(LangError::OutOfRange));
        assert_eq!(parse(&"map x".repeat(20)), Err(LangError::TooLong));
        assert_eq!(run(&["map x+q"], &[1]), Err(LangError::Unbound('q')));
        assert_eq!(run(&["map x+q"], &[]), Ok(vec![]));
        assert_eq!(run(&["take x"], &[1]), Err(LangError::XOutside));
        assert_eq!(run(&["take 0-1"], &[1]), Err(LangError::NegativeCount));
        assert_eq!(run(&["map x/0"], &[1]), Err(LangError::DivisionByZero));
        assert_eq!(run(&["map x%0"], &[1]), Err(LangError::DivisionByZero));
        assert_eq!(
            run(&["map x*999999999*999999999"], &[2]),
            Err(LangError::OutOfRange)
        );
        assert_eq!(run(&["fold *"], &[100_000; 5]), Err(LangError::OutOfRange));
        assert_eq!(run(&["scan *"], &[100_000; 5]), Err(LangError::OutOfRange));
        assert_eq!(parse("  sort  "), parse("sort"));
        assert!(parse("ret").is_ok_and(|s| s.is_ret()));
        assert_eq!(show(&[3, -1, 7]), "[3 -1 7]");
        assert_eq!(show(&[]), "[]");
    }

    #[test]
    fn random_programs_always_terminate_within_the_limits() {
        // Random lines drawn from the statement words, operands and junk; every program,
        // garbage included, parses to a result or a named error, and no list ever grows.
        use rlany_contract::Rng;
        const PIECES: &[&str] = &[
            "keep ",
            "map ",
            "take ",
            "drop ",
            "rev",
            "sort",
            "scan ",
            "pair ",
            "fold ",
            "count",
            "let ",
            "ret",
            "x",
            "a",
            "b",
            "q",
            "=",
            "==",
            ">",
            "<=",
            "!=",
            "+",
            "-",
            "*",
            "/",
            "%",
            "max",
            "min",
            "sum",
            "len",
            "first",
            "last",
            "0",
            "1",
            "7",
            "999999999",
            " ",
            "é",
            "🦀",
            "\u{0}",
            ";",
            "rm -rf /",
        ];
        let mut rng = Rng::new(7);
        let (mut errors, mut executed) = (0, 0);
        for _ in 0..20_000 {
            let lines: Vec<String> = (0..1 + rng.below(8))
                .map(|_| {
                    (0..rng.below(8))
                        .map(|_| PIECES[rng.below(PIECES.len())])
                        .collect()
                })
                .collect();
            let input: Vec<i64> = (0..rng.below(7))
                .map(|_| rng.range_inclusive(-MAX_ABS, MAX_ABS))
                .collect();
            let parsed: Vec<Stmt> = lines.iter().filter_map(|l| parse(l).ok()).collect();
            let mut m = Machine::new(&input);
            for s in &parsed {
                executed += 1;
                match m.exec(s) {
                    Ok(()) => {
                        assert!(m.xs.len() <= input.len().max(1));
                        assert!(m.xs.iter().all(|v| v.abs() <= MAX_ABS));
                    }
                    Err(_) => {
                        errors += 1;
                        break;
                    }
                }
            }
        }
        // The mix exercises both outcomes.
        assert!(errors > 50 && executed > 1000, "{errors} {executed}");
    }
}
